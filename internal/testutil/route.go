package testutil

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// Route is one request to a server's router and the answer it must get.
type Route struct {
	Method, Target, Body string
	// Status is the status wanted; 0: any answer of the route's handler
	// (one that depends on who runs the test, root or not).
	Status int
	// Allow is the Allow header wanted ("": none).
	Allow string
	// Message is the error message wanted ("": not checked).
	Message string
}

// codeOfStatus is the error code of each status a router's tests see.
var codeOfStatus = map[int]string{400: api.CodeBadRequest, 403: api.CodeForbidden, 404: api.CodeNotFound, 405: api.CodeMethodNotAllowed}

// CheckRoute holds one answer to what tc wants: a refusal of the router is a
// JSON error with the status's code; a handler's answer is never one of the
// router's refusals.
func CheckRoute(t testing.TB, tc Route, status int, hdr http.Header, body string) {
	t.Helper()
	what := tc.Method + " " + tc.Target
	if tc.Status == 0 {
		if status == http.StatusMethodNotAllowed || strings.Contains(body, "no such endpoint") {
			t.Errorf("%s = %d %s; want the route's handler", what, status, body)
		}
		return
	}
	if status != tc.Status {
		t.Errorf("%s = %d %s; want %d", what, status, body, tc.Status)
		return
	}
	if got := hdr.Get("Allow"); got != tc.Allow {
		t.Errorf("%s: Allow %q, want %q", what, got, tc.Allow)
	}
	if status < 400 {
		return
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: error with Content-Type %q", what, ct)
	}
	if tc.Method == http.MethodHead && body == "" {
		return // an answer to HEAD over the wire has no body
	}
	var eb api.ErrorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil {
		t.Errorf("%s: error body %q: %v", what, body, err)
		return
	}
	if eb.Error.Code != codeOfStatus[status] {
		t.Errorf("%s: code %q with status %d", what, eb.Error.Code, status)
	}
	if tc.Message != "" && eb.Error.Message != tc.Message {
		t.Errorf("%s: message %q, want %q", what, eb.Error.Message, tc.Message)
	}
}
