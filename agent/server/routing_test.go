package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// routeCase is one request written to a server as bytes (so that no client
// cleans its target) and the answer it must get.
type routeCase struct {
	method, target, body string
	// status is the status wanted; 0: any answer of the route's handler,
	// which depends on who runs the test (root or not).
	status int
	// allow is the Allow header wanted ("": none).
	allow string
	// message is the error message wanted ("": not checked).
	message string
}

// rawRequest writes method and target to the server at network/addr over a
// connection of its own and reads the answer.
func rawRequest(t *testing.T, network, addr, method, target, body string) (int, http.Header, string) {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: gpulet\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", method, target, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, target, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// checkRoute holds one answer to what tc wants: a refusal of the router is
// a JSON error with the status's code; a handler's answer is never one of
// the router's refusals.
func checkRoute(t *testing.T, tc routeCase, status int, hdr http.Header, body string) {
	t.Helper()
	what := tc.method + " " + tc.target
	if tc.status == 0 {
		if status == http.StatusMethodNotAllowed || strings.Contains(body, "no such endpoint") {
			t.Errorf("%s = %d %s; want the route's handler", what, status, body)
		}
		return
	}
	if status != tc.status {
		t.Errorf("%s = %d %s; want %d", what, status, body, tc.status)
		return
	}
	if got := hdr.Get("Allow"); got != tc.allow {
		t.Errorf("%s: Allow %q, want %q", what, got, tc.allow)
	}
	if status < 400 {
		return
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: error with Content-Type %q", what, ct)
	}
	if tc.method == http.MethodHead {
		return // no body
	}
	var eb api.ErrorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil {
		t.Errorf("%s: error body %q: %v", what, body, err)
		return
	}
	if eb.Error.Code != codeOfStatus[status] {
		t.Errorf("%s: code %q with status %d", what, eb.Error.Code, status)
	}
	if tc.message != "" && eb.Error.Message != tc.message {
		t.Errorf("%s: message %q, want %q", what, eb.Error.Message, tc.message)
	}
}

// codeOfStatus is the error code of each status these tests see.
var codeOfStatus = map[int]string{400: api.CodeBadRequest, 403: api.CodeForbidden, 404: api.CodeNotFound, 405: api.CodeMethodNotAllowed}

// TestRouting pins how the Unix socket's API routes: each route reaches its
// handler by its method, another method is a 405 that says which are
// allowed, anything else a 404; a path matches without its leading and
// trailing slashes, segment by segment of the decoded path ("%2F" separates
// segments, "." and ".." are ids like any other), an empty segment matches
// nothing, and HEAD is not GET.
func TestRouting(t *testing.T) {
	core := newFakeCore(t)
	core.sim = true
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(core, -1, slog.New(slog.DiscardHandler)).HTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	notAllowed := func(method, target, allow string) routeCase {
		return routeCase{method: method, target: target, status: 405, allow: allow,
			message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", method, target, allow)}
	}
	noEndpoint := func(method, target, path string) routeCase {
		return routeCase{method: method, target: target, status: 404, message: "no such endpoint: " + path}
	}
	noLease := func(method, target, id string) routeCase {
		return routeCase{method: method, target: target, status: 404, message: fmt.Sprintf("no lease %q", id)}
	}
	cases := []routeCase{
		// Every route reaches its handler.
		{method: "GET", target: "/metrics", status: 200},
		{method: "GET", target: "/v1/gpus", status: 200},
		{method: "GET", target: "/v1/leases", status: 200},
		{method: "POST", target: "/v1/leases", body: `{"units":1,"ttl":"1m"}`, status: 201},
		noLease("GET", "/v1/leases/l-nope", "l-nope"),
		noLease("DELETE", "/v1/leases/l-nope", "l-nope"),
		noLease("POST", "/v1/leases/l-nope/renew", "l-nope"),
		{method: "DELETE", target: "/v1/slurm/jobs/x", status: 400, message: `slurm job: "x" is not a job id (a whole number from 1)`},
		{method: "GET", target: "/v1/reservations", status: 200},
		{method: "POST", target: "/v1/reservations", body: `{}`, status: 400},
		{method: "GET", target: "/v1/reservations/nope", status: 404, message: `no reservation named "nope"`},
		{method: "DELETE", target: "/v1/reservations/nope", status: 404, message: `no reservation named "nope"`},
		{method: "POST", target: "/v1/reservations/nope/advance", status: 404, message: `no reservation named "nope"`},
		{method: "POST", target: "/v1/node/drain"},
		{method: "POST", target: "/v1/node/undrain", body: `{"gpu":"zz"}`},
		{method: "POST", target: "/v1/sim/gpus/x", body: `{}`},
		{method: "GET", target: "/v1/snapshot", status: 200},
		{method: "POST", target: "/v1/placements", body: `{"units":1}`, status: 200},
		{method: "GET", target: "/v1/profiles", status: 200},
		{method: "GET", target: "/v1/pools", status: 200},
		{method: "GET", target: "/v1/quotas", status: 200},

		// Another method: 405, with the allowed ones in the order of the
		// route table.
		notAllowed("PUT", "/v1/snapshot", "GET"),
		notAllowed("POST", "/metrics", "GET"),
		notAllowed("POST", "/v1/gpus", "GET"),
		notAllowed("DELETE", "/v1/leases", "GET, POST"),
		notAllowed("PUT", "/v1/leases/l-1", "GET, DELETE"),
		notAllowed("GET", "/v1/leases/l-1/renew", "POST"),
		notAllowed("GET", "/v1/slurm/jobs/1", "DELETE"),
		notAllowed("PATCH", "/v1/reservations", "GET, POST"),
		notAllowed("POST", "/v1/reservations/wf", "GET, DELETE"),
		notAllowed("GET", "/v1/reservations/wf/advance", "POST"),
		notAllowed("GET", "/v1/node/drain", "POST"),
		notAllowed("DELETE", "/v1/node/undrain", "POST"),
		notAllowed("GET", "/v1/sim/gpus/0", "POST"),
		notAllowed("GET", "/v1/placements", "POST"),
		notAllowed("POST", "/v1/profiles", "GET"),
		notAllowed("DELETE", "/v1/pools", "GET"),
		notAllowed("PUT", "/v1/quotas", "GET"),
		notAllowed("OPTIONS", "/v1/leases", "GET, POST"),
		notAllowed("CONNECT", "/v1/leases", "GET, POST"),
		notAllowed("get", "/v1/snapshot", "GET"),
		// HEAD is a method of its own here: no route answers it.
		{method: "HEAD", target: "/v1/leases", status: 405, allow: "GET, POST"},
		{method: "HEAD", target: "/v1/snapshot", status: 405, allow: "GET"},
		{method: "HEAD", target: "/v1/nothing", status: 404},

		// Unknown paths: 404 whatever the method.
		noEndpoint("GET", "/v1/nothing", "/v1/nothing"),
		noEndpoint("PUT", "/nothing", "/nothing"),
		noEndpoint("GET", "/", "/"),
		noEndpoint("GET", "/v1", "/v1"),
		noEndpoint("GET", "/V1/leases", "/V1/leases"),
		noEndpoint("GET", "/v1/leases/l-1/renew/x", "/v1/leases/l-1/renew/x"),
		noEndpoint("GET", "*", "*"),
		noEndpoint("GET", "http://gpulet", ""),

		// The path's form: leading and trailing slashes do not count, an
		// empty segment between two slashes matches nothing.
		{method: "GET", target: "/v1/leases/", status: 200},
		{method: "GET", target: "//v1/leases", status: 200},
		{method: "GET", target: "/v1/leases//", status: 200},
		{method: "POST", target: "/v1/leases/", body: `{"units":1,"ttl":"1m"}`, status: 201},
		noLease("DELETE", "/v1/leases/l-nope/", "l-nope"),
		notAllowed("PUT", "/v1/snapshot/", "GET"),
		noEndpoint("GET", "/v1//leases", "/v1//leases"),
		noEndpoint("GET", "/v1/leases//l-1", "/v1/leases//l-1"),
		noEndpoint("GET", "//", "//"),
		// The decoded path, split on "/": an encoded slash separates
		// segments, an encoded letter is the letter.
		noEndpoint("GET", "/v1/leases/a%2Fb", "/v1/leases/a/b"),
		noLease("POST", "/v1/leases/a%2Frenew", "a"),
		{method: "GET", target: "/v1%2Fleases", status: 200},
		{method: "GET", target: "/v1/%6Ceases", status: 200},
		noLease("GET", "/v1/leases/l-1%20x", "l-1 x"),
		noLease("GET", "/v1/leases/%25", "%"),
		// "." and ".." are segments as written, never resolved.
		noLease("GET", "/v1/leases/.", "."),
		noLease("DELETE", "/v1/leases/..", ".."),
		noLease("POST", "/v1/leases/../renew", ".."),
		noLease("GET", "/v1/leases/%2E%2E", ".."),
		noEndpoint("GET", "/v1/./leases", "/v1/./leases"),
		noEndpoint("GET", "/v1/leases/../gpus", "/v1/leases/../gpus"),
		noEndpoint("GET", "/v1/gpus/..", "/v1/gpus/.."),
		// The query is not the path; an absolute target is its path.
		{method: "GET", target: "/v1/leases?x=1", status: 200},
		{method: "GET", target: "/v1/leases/?x=1", status: 200},
		{method: "GET", target: "http://gpulet/v1/gpus", status: 200},
	}
	for _, tc := range cases {
		status, hdr, body := rawRequest(t, "unix", sock, tc.method, tc.target, tc.body)
		checkRoute(t, tc, status, hdr, body)
	}

	// Without the simulated backend its route does not exist.
	plain := New(newFakeCore(t), -1, slog.New(slog.DiscardHandler)).HTTPServer()
	plainSock := filepath.Join(t.TempDir(), "p.sock")
	pln, err := net.Listen("unix", plainSock)
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(pln)
	t.Cleanup(func() { plain.Close() })
	for _, tc := range []routeCase{
		noEndpoint("POST", "/v1/sim/gpus/0", "/v1/sim/gpus/0"),
		noEndpoint("GET", "/v1/sim/gpus/0", "/v1/sim/gpus/0"),
	} {
		status, hdr, body := rawRequest(t, "unix", plainSock, tc.method, tc.target, tc.body)
		checkRoute(t, tc, status, hdr, body)
	}
}

// TestIdentityBeforeRouting: a request without a caller's identity is
// refused before any route is looked up, unknown paths included.
func TestIdentityBeforeRouting(t *testing.T) {
	s := New(newFakeCore(t), -1, slog.New(slog.DiscardHandler))
	for _, target := range []string{"/v1/leases", "/v1/nothing", "/v1//x"} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("PUT", target, nil))
		if rec.Code != 403 || !strings.Contains(rec.Body.String(), "caller identity unknown") {
			t.Errorf("PUT %s without identity: %d %s", target, rec.Code, rec.Body)
		}
	}
}

// TestReadOnlyRouting pins how the TCP server (--listen) routes: its three
// paths exactly as written (no slash more or less; "%2F" is a slash), GET
// and HEAD on them, 405 for other methods, 404 for every other path.
func TestReadOnlyRouting(t *testing.T) {
	srv := New(newFakeCore(t), -1, slog.New(slog.DiscardHandler)).ReadOnlyHTTPServer(false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	notAllowed := func(method, target string) routeCase {
		return routeCase{method: method, target: target, status: 405, allow: "GET, HEAD",
			message: fmt.Sprintf("%s is not allowed on %s (allowed: GET)", method, target)}
	}
	notHere := func(method, target, path string) routeCase {
		return routeCase{method: method, target: target, status: 404,
			message: "no such endpoint here: " + path + " (over TCP gpuletd serves only GET /v1/snapshot, /v1/gpus and /metrics; the rest is on its Unix socket)"}
	}
	for _, tc := range []routeCase{
		{method: "GET", target: "/v1/snapshot", status: 200},
		{method: "GET", target: "/v1/gpus", status: 200},
		{method: "GET", target: "/metrics", status: 200},
		{method: "HEAD", target: "/v1/snapshot", status: 200},
		{method: "HEAD", target: "/v1/gpus", status: 200},
		{method: "HEAD", target: "/metrics", status: 200},
		{method: "GET", target: "/v1/snapshot?after=x", status: 400},
		{method: "GET", target: "/v1%2Fsnapshot", status: 200},
		{method: "GET", target: "/v1/%73napshot", status: 200},
		{method: "GET", target: "http://gpulet/metrics", status: 200},
		notAllowed("POST", "/v1/snapshot"),
		notAllowed("DELETE", "/metrics"),
		notAllowed("PUT", "/v1/gpus"),
		notAllowed("OPTIONS", "/v1/gpus"),
		notAllowed("get", "/v1/gpus"),
		notHere("GET", "/v1/leases", "/v1/leases"),
		notHere("POST", "/v1/leases", "/v1/leases"),
		notHere("POST", "/v1/node/drain", "/v1/node/drain"),
		notHere("PUT", "/nothing", "/nothing"),
		notHere("HEAD", "/nothing", "/nothing"),
		notHere("GET", "/", "/"),
		notHere("GET", "*", "*"),
		notHere("GET", "/v1/snapshot/", "/v1/snapshot/"),
		notHere("POST", "/v1/snapshot/", "/v1/snapshot/"),
		notHere("GET", "//v1/snapshot", "//v1/snapshot"),
		notHere("GET", "/v1//snapshot", "/v1//snapshot"),
		notHere("GET", "/v1/./snapshot", "/v1/./snapshot"),
		notHere("GET", "/v1/../v1/gpus", "/v1/../v1/gpus"),
		notHere("GET", "/metrics/.", "/metrics/."),
		notHere("GET", "/v1/snapshot%2F", "/v1/snapshot/"),
	} {
		status, hdr, body := rawRequest(t, "tcp", ln.Addr().String(), tc.method, tc.target, tc.body)
		checkRoute(t, tc, status, hdr, body)
	}
}
