package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/api"
)

// Bounds on request fields, so that no request can make the daemon keep much.
const (
	maxLabels      = 64
	maxLabelLen    = 256
	maxTextLen     = 256
	minTTL         = time.Second
	maxTTL         = 30 * 24 * time.Hour
	maxWait        = 24 * time.Hour
	MaxRequestBody = 1 << 20
)

// DecodeRequestBytes decodes one JSON lease request, a body read whole, and
// checks every field that can be checked without the node's state. Errors
// wrap api.ErrBadRequest and name the field.
func DecodeRequestBytes(b []byte) (lease.Request, error) {
	if lr, ok := decodeRequestFast(b); ok {
		req := lease.Request{LeaseRequest: lr}
		return req, validate(&req)
	}
	return decodeRequestJSON(b)
}

// decodeRequestJSON decodes a lease request with encoding/json, strictly.
func decodeRequestJSON(b []byte) (lease.Request, error) {
	var req lease.Request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req.LeaseRequest); err != nil {
		return lease.Request{}, jsonError(err)
	}
	if dec.More() {
		return lease.Request{}, api.Errorf(api.ErrBadRequest, "request body: more than one JSON value")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return lease.Request{}, api.Errorf(api.ErrBadRequest, "request body: trailing data after the JSON object")
	}
	return req, validate(&req)
}

func validate(req *lease.Request) error {
	lr := &req.LeaseRequest
	if err := validateShape(lr); err != nil {
		return err
	}
	var err error
	if lr.TTL != "" {
		if req.TTL, err = parseDuration("ttl", lr.TTL, minTTL, maxTTL); err != nil {
			return err
		}
		if lr.PID != 0 {
			return api.Errorf(api.ErrBadRequest, "pid and ttl: a lease is bound to a process or to time, not both")
		}
	}
	if err := validateSlurm(lr); err != nil {
		return err
	}
	if lr.Wait != "" {
		if req.Wait, err = parseDuration("wait", lr.Wait, 0, maxWait); err != nil {
			return err
		}
	}
	// Above the kernel's ceiling no process can exist, and the number could be
	// cut to another pid on its way into a syscall.
	if lr.PID < 0 || lr.PID > procwatch.MaxPID {
		return api.Errorf(api.ErrBadRequest, "pid: must be a process id from 1 to %d, got %d", procwatch.MaxPID, lr.PID)
	}
	if lr.MinCC != "" {
		if req.MinCapability, err = api.ParseComputeCapability(lr.MinCC); err != nil {
			return api.Errorf(api.ErrBadRequest, "min_cc: %v", err)
		}
	}
	for _, f := range []struct{ name, v string }{{"gpu", lr.GPU}, {"pool", lr.Pool}, {"type", lr.Type}, {"task", lr.Task}, {"reservation", lr.Reservation}} {
		if len(f.v) > maxTextLen {
			return api.Errorf(api.ErrBadRequest, "%s: longer than %d bytes", f.name, maxTextLen)
		}
		if strings.ContainsFunc(f.v, isControl) {
			return api.Errorf(api.ErrBadRequest, "%s: control characters are not allowed", f.name)
		}
	}
	if len(lr.Labels) > maxLabels {
		return api.Errorf(api.ErrBadRequest, "labels: more than %d", maxLabels)
	}
	for k, v := range lr.Labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen {
			return api.Errorf(api.ErrBadRequest, "labels: keys must be 1 to %d bytes and values at most %d", maxLabelLen, maxLabelLen)
		}
	}
	return nil
}

// validateShape checks what a request asks: units of one GPU, or whole GPUs.
func validateShape(lr *api.LeaseRequest) error {
	switch {
	case lr.GPUs < 0:
		return api.Errorf(api.ErrBadRequest, "gpus: must be at least 1 when given, got %d", lr.GPUs)
	case lr.GPUs == 0 && lr.Units < 1:
		return api.Errorf(api.ErrBadRequest, "units: must be at least 1, got %d", lr.Units)
	case lr.GPUs == 0:
		return nil
	case lr.Units != 0:
		return api.Errorf(api.ErrBadRequest, "units and gpus: a request asks for units of one GPU or for whole GPUs, not both")
	case lr.GPU != "":
		return api.Errorf(api.ErrBadRequest, "gpu and gpus: a request for whole GPUs cannot name one GPU")
	case lr.Reservation != "" || lr.Preemptible:
		return api.Errorf(api.ErrBadRequest, "gpus: whole GPUs are not drawn from a reservation nor borrowed (reservation, preemptible)")
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func parseDuration(field, s string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, api.Errorf(api.ErrBadRequest, "%s: %q is not a duration such as 30s or 5m", field, s)
	}
	if d < lo || d > hi {
		return 0, api.Errorf(api.ErrBadRequest, "%s: %s is outside %s to %s", field, s, lo, hi)
	}
	return d, nil
}

// jsonError turns a decoder error into a bad request naming the field or place.
func jsonError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return api.Errorf(api.ErrBadRequest, "request body: empty, want a JSON object such as {\"units\":1}")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Errorf(api.ErrBadRequest, "request body: malformed JSON: it ends too early")
	case errors.As(err, &typeErr):
		return api.Errorf(api.ErrBadRequest, "%s: must be %s, got a JSON %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return api.Errorf(api.ErrBadRequest, "request body: malformed JSON at byte %d: %v", syntaxErr.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return api.Errorf(api.ErrBadRequest, "request body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return api.Errorf(api.ErrBadRequest, "request body: %v", err)
}

// jsonKind names a Go type the way a JSON writer thinks of it.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint64, reflect.Uint32, reflect.Uint, reflect.Float64:
		return "a whole number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "a " + t.String()
}

// DecodeJSON decodes one JSON value strictly (unknown fields refused, nothing
// after it) into v, for the API's smaller bodies.
func DecodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return api.Errorf(api.ErrBadRequest, "request body: trailing data after the JSON value")
	}
	return nil
}

// validateSlurm checks a request's "slurm" field.
func validateSlurm(lr *api.LeaseRequest) error {
	switch lr.Slurm {
	case "", api.SlurmScopeJob, api.SlurmScopeStep:
	default:
		return api.Errorf(api.ErrBadRequest, "slurm: must be %q or %q, got %q", api.SlurmScopeJob, api.SlurmScopeStep, lr.Slurm)
	}
	if lr.Slurm != "" && (lr.TTL != "" || lr.PID != 0) {
		return api.Errorf(api.ErrBadRequest, "slurm: a lease is bound to a Slurm job, a process or a ttl, only one")
	}
	return nil
}
