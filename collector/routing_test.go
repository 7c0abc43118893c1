package collector

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// TestRouting pins how the collector routes: each route reaches its handler
// by its method (HEAD is not GET), another method is a 405 that says which is
// allowed, and every other path a 404, the paths matched exactly as the
// decoded path is written: no slash more or less, "%2F" a slash, "." and
// ".." never resolved.
func TestRouting(t *testing.T) {
	s := NewServer(NewStore(15*time.Second, time.Now), nil)
	type routeCase struct {
		method, target, body string
		status               int
		allow, message       string
	}
	notAllowed := func(method, target, allow string) routeCase {
		return routeCase{method: method, target: target, status: 405, allow: allow,
			message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", method, target, allow)}
	}
	noEndpoint := func(method, target, path string) routeCase {
		return routeCase{method: method, target: target, status: 404, message: "no such endpoint: " + path}
	}
	for _, tc := range []routeCase{
		// Every route reaches its handler.
		{method: "GET", target: "/metrics", status: 200},
		{method: "GET", target: "/v1/nodes", status: 200},
		{method: "GET", target: "/v1/nodes?x=1", status: 400, message: "/v1/nodes takes no query parameters"},
		{method: "POST", target: "/v1/placements", body: `{`, status: 400},
		{method: "POST", target: "/v1/snapshots", body: `{`, status: 400},
		{method: "GET", target: "/v1/table", status: 200},
		{method: "GET", target: "/v1%2Fnodes", status: 200},
		{method: "GET", target: "/v1/%6Eodes", status: 200},
		{method: "GET", target: "http://collector/v1/table", status: 200},

		// Another method: 405.
		notAllowed("POST", "/metrics", "GET"),
		notAllowed("POST", "/v1/nodes", "GET"),
		notAllowed("GET", "/v1/placements", "POST"),
		notAllowed("GET", "/v1/snapshots", "POST"),
		notAllowed("PUT", "/v1/snapshots", "POST"),
		notAllowed("DELETE", "/v1/table", "GET"),
		notAllowed("OPTIONS", "/v1/table", "GET"),
		notAllowed("get", "/v1/nodes", "GET"),
		notAllowed("HEAD", "/v1/nodes", "GET"),
		notAllowed("HEAD", "/metrics", "GET"),

		// Every other path: 404, whatever the method.
		noEndpoint("GET", "/v1/nothing", "/v1/nothing"),
		noEndpoint("PUT", "/nothing", "/nothing"),
		noEndpoint("HEAD", "/nothing", "/nothing"),
		noEndpoint("GET", "/", "/"),
		noEndpoint("GET", "*", "*"),
		noEndpoint("GET", "/v1/nodes/", "/v1/nodes/"),
		noEndpoint("POST", "/v1/snapshots/", "/v1/snapshots/"),
		noEndpoint("GET", "//v1/nodes", "//v1/nodes"),
		noEndpoint("GET", "/v1//nodes", "/v1//nodes"),
		noEndpoint("GET", "/v1/./nodes", "/v1/./nodes"),
		noEndpoint("GET", "/v1/table/..", "/v1/table/.."),
		noEndpoint("GET", "/v1/x/../nodes", "/v1/x/../nodes"),
		noEndpoint("GET", "/v1/nodes%2F", "/v1/nodes/"),
		noEndpoint("GET", "/V1/nodes", "/V1/nodes"),
	} {
		what := tc.method + " " + tc.target
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body)))
		if rec.Code != tc.status {
			t.Errorf("%s = %d %s; want %d", what, rec.Code, rec.Body, tc.status)
			continue
		}
		if got := rec.Header().Get("Allow"); got != tc.allow {
			t.Errorf("%s: Allow %q, want %q", what, got, tc.allow)
		}
		if rec.Code < 400 {
			continue
		}
		var eb api.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: error body %q (%s): %v", what, rec.Body, rec.Header().Get("Content-Type"), err)
			continue
		}
		if want := map[int]string{400: api.CodeBadRequest, 404: api.CodeNotFound, 405: api.CodeMethodNotAllowed}[rec.Code]; eb.Error.Code != want {
			t.Errorf("%s: code %q with status %d", what, eb.Error.Code, rec.Code)
		}
		if tc.message != "" && eb.Error.Message != tc.message {
			t.Errorf("%s: message %q, want %q", what, eb.Error.Message, tc.message)
		}
	}
}
