package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gpulet/gpulet/internal/errdefs"
)

// Error codes of the API's error body.
const (
	CodeBadRequest        = "bad_request"
	CodeNotFound          = "not_found"
	CodeForbidden         = "forbidden"
	CodeInsufficientUnits = "insufficient_units"
	CodeQuotaExceeded     = "quota_exceeded"
	CodeUnavailable       = "unavailable"
	CodeMethodNotAllowed  = "method_not_allowed"
	CodeRequestTooLarge   = "request_too_large"
	// CodeTooManyRequests: the caller's user has as many requests under way
	// as one user may; retry once one has ended.
	CodeTooManyRequests = "too_many_requests"
	// CodeConflict: what the request would make exists already (a
	// reservation of that name).
	CodeConflict = "conflict"
	CodeInternal = "internal"
)

// NeverFits begins the message of an insufficient_units error that no change
// of the node's load could lift (no GPU of the type asked, more memory than any
// has): waiting for it is pointless.
const NeverFits = "nothing on this node can ever fit the request"

// Sentinel errors. The daemon's edge wraps them with %w to add a message; the
// client returns errors that match them with errors.Is. The engine's kinds of
// failure (package errdefs) are the codes' sentinels: the codes table below
// is where the engine's refusals become the wire's.
var (
	ErrBadRequest        = errdefs.ErrInvalid
	ErrNotFound          = errdefs.ErrNotFound
	ErrForbidden         = errdefs.ErrPermission
	ErrInsufficientUnits = errdefs.ErrNoCapacity
	ErrQuotaExceeded     = errdefs.ErrQuota
	ErrUnavailable       = errdefs.ErrUnavailable
	ErrMethodNotAllowed  = errors.New(CodeMethodNotAllowed)
	ErrRequestTooLarge   = errors.New(CodeRequestTooLarge)
	ErrTooManyRequests   = errdefs.ErrTooMany
	ErrConflict          = errdefs.ErrConflict
)

var codes = []struct {
	err    error
	code   string
	status int
}{
	{ErrBadRequest, CodeBadRequest, http.StatusBadRequest},
	{ErrNotFound, CodeNotFound, http.StatusNotFound},
	{ErrForbidden, CodeForbidden, http.StatusForbidden},
	{ErrInsufficientUnits, CodeInsufficientUnits, http.StatusConflict},
	{ErrQuotaExceeded, CodeQuotaExceeded, http.StatusForbidden},
	{ErrUnavailable, CodeUnavailable, http.StatusServiceUnavailable},
	{ErrMethodNotAllowed, CodeMethodNotAllowed, http.StatusMethodNotAllowed},
	{ErrRequestTooLarge, CodeRequestTooLarge, http.StatusRequestEntityTooLarge},
	{ErrTooManyRequests, CodeTooManyRequests, http.StatusTooManyRequests},
	{ErrConflict, CodeConflict, http.StatusConflict},
}

// ErrorBody is the JSON body of every non-2xx answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// StatusOf maps an error to the HTTP status and code the API answers with.
// Errors that wrap no sentinel are internal errors.
func StatusOf(err error) (status int, code string) {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, CodeInternal
}

// Errorf returns an error that wraps sentinel and reads as the formatted
// message, the code left out of it, so that the API's message field reads as
// a sentence (errdefs.Errorf).
func Errorf(sentinel error, format string, args ...any) error {
	return errdefs.Errorf(sentinel, format, args...)
}

// FromBody turns an error body received by a client back into an error that
// errors.Is matches against the sentinel of its code.
func FromBody(status int, body ErrorBody) error {
	for _, c := range codes {
		if c.code == body.Error.Code {
			return errdefs.Errorf(c.err, "%s", body.Error.Message)
		}
	}
	msg := body.Error.Message
	if msg == "" {
		msg = http.StatusText(status)
	}
	return fmt.Errorf("%s (HTTP %d, code %q)", msg, status, body.Error.Code)
}
