// Package errdefs is the engine's vocabulary of refusals: what kind of
// failure an error of the lease table, the placement engine, the inventory,
// reservations or the cluster table is, apart from how any protocol says it.
// The engine wraps a kind with Errorf; the HTTP API maps each kind to its wire
// code and status at the edge (api.StatusOf), as containerd's errdefs leaves
// the mapping to its gRPC and HTTP layers, so the engine speaks no HTTP.
package errdefs

import (
	"errors"
	"fmt"
)

// The kinds of failure. Match them with errors.Is. Each reads as the name
// gpulet has always given it (the API's code of the same name), so that one
// printed bare reads as before.
var (
	// ErrInvalid: the request cannot be served as asked (a bad field, no
	// such GPU, more than one process may hold).
	ErrInvalid = errors.New("bad_request")
	// ErrNotFound: what the request names does not exist (or is not the
	// caller's to see).
	ErrNotFound = errors.New("not_found")
	// ErrPermission: the caller may not do this.
	ErrPermission = errors.New("forbidden")
	// ErrNoCapacity: not enough units (or memory, or whole GPUs) now, or,
	// where the message says so, ever.
	ErrNoCapacity = errors.New("insufficient_units")
	// ErrQuota: the caller's quota would be passed.
	ErrQuota = errors.New("quota_exceeded")
	// ErrUnavailable: the engine cannot serve now (stopping, draining, a
	// journal that cannot be written).
	ErrUnavailable = errors.New("unavailable")
	// ErrTooMany: the caller has as many requests under way as one may.
	ErrTooMany = errors.New("too_many_requests")
	// ErrConflict: what the request would make exists, or contradicts what
	// is held already.
	ErrConflict = errors.New("conflict")
)

// Errorf returns an error of kind that reads as the formatted message alone:
// the kind is for errors.Is, the message for whoever reads it.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }
