package server

import (
	"bufio"
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

	"github.com/gpulet/gpulet/internal/testutil"
)

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
	srv := New(partsOf(core), -1, slog.New(slog.DiscardHandler)).HTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	notAllowed := func(method, target, allow string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 405, Allow: allow,
			Message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", method, target, allow)}
	}
	noEndpoint := func(method, target, path string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 404, Message: "no such endpoint: " + path}
	}
	noLease := func(method, target, id string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 404, Message: fmt.Sprintf("no lease %q", id)}
	}
	cases := []testutil.Route{
		// Every route reaches its handler.
		{Method: "GET", Target: "/metrics", Status: 200},
		{Method: "GET", Target: "/v1/gpus", Status: 200},
		{Method: "GET", Target: "/v1/leases", Status: 200},
		{Method: "POST", Target: "/v1/leases", Body: `{"units":1,"ttl":"1m"}`, Status: 201},
		noLease("GET", "/v1/leases/l-nope", "l-nope"),
		noLease("DELETE", "/v1/leases/l-nope", "l-nope"),
		noLease("POST", "/v1/leases/l-nope/renew", "l-nope"),
		{Method: "DELETE", Target: "/v1/slurm/jobs/x", Status: 400, Message: `slurm job: "x" is not a job id (a whole number from 1)`},
		{Method: "GET", Target: "/v1/reservations", Status: 200},
		{Method: "POST", Target: "/v1/reservations", Body: `{}`, Status: 400},
		{Method: "GET", Target: "/v1/reservations/nope", Status: 404, Message: `no reservation named "nope"`},
		{Method: "DELETE", Target: "/v1/reservations/nope", Status: 404, Message: `no reservation named "nope"`},
		{Method: "POST", Target: "/v1/reservations/nope/advance", Status: 404, Message: `no reservation named "nope"`},
		{Method: "POST", Target: "/v1/node/drain"},
		{Method: "POST", Target: "/v1/node/undrain", Body: `{"gpu":"zz"}`},
		{Method: "POST", Target: "/v1/sim/gpus/x", Body: `{}`},
		{Method: "GET", Target: "/v1/snapshot", Status: 200},
		{Method: "POST", Target: "/v1/placements", Body: `{"units":1}`, Status: 200},
		{Method: "GET", Target: "/v1/profiles", Status: 200},
		{Method: "GET", Target: "/v1/pools", Status: 200},
		{Method: "GET", Target: "/v1/quotas", Status: 200},

		// Another Method: 405, with the allowed ones in the order of the
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
		{Method: "HEAD", Target: "/v1/leases", Status: 405, Allow: "GET, POST"},
		{Method: "HEAD", Target: "/v1/snapshot", Status: 405, Allow: "GET"},
		{Method: "HEAD", Target: "/v1/nothing", Status: 404},

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
		{Method: "GET", Target: "/v1/leases/", Status: 200},
		{Method: "GET", Target: "//v1/leases", Status: 200},
		{Method: "GET", Target: "/v1/leases//", Status: 200},
		{Method: "POST", Target: "/v1/leases/", Body: `{"units":1,"ttl":"1m"}`, Status: 201},
		noLease("DELETE", "/v1/leases/l-nope/", "l-nope"),
		notAllowed("PUT", "/v1/snapshot/", "GET"),
		noEndpoint("GET", "/v1//leases", "/v1//leases"),
		noEndpoint("GET", "/v1/leases//l-1", "/v1/leases//l-1"),
		noEndpoint("GET", "//", "//"),
		// The decoded path, split on "/": an encoded slash separates
		// segments, an encoded letter is the letter.
		noEndpoint("GET", "/v1/leases/a%2Fb", "/v1/leases/a/b"),
		noLease("POST", "/v1/leases/a%2Frenew", "a"),
		{Method: "GET", Target: "/v1%2Fleases", Status: 200},
		{Method: "GET", Target: "/v1/%6Ceases", Status: 200},
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
		{Method: "GET", Target: "/v1/leases?x=1", Status: 200},
		{Method: "GET", Target: "/v1/leases/?x=1", Status: 200},
		{Method: "GET", Target: "http://gpulet/v1/gpus", Status: 200},
	}
	for _, tc := range cases {
		status, hdr, body := rawRequest(t, "unix", sock, tc.Method, tc.Target, tc.Body)
		testutil.CheckRoute(t, tc, status, hdr, body)
	}

	// Without the simulated backend its route does not exist.
	plain := New(partsOf(newFakeCore(t)), -1, slog.New(slog.DiscardHandler)).HTTPServer()
	plainSock := filepath.Join(t.TempDir(), "p.sock")
	pln, err := net.Listen("unix", plainSock)
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(pln)
	t.Cleanup(func() { plain.Close() })
	for _, tc := range []testutil.Route{
		noEndpoint("POST", "/v1/sim/gpus/0", "/v1/sim/gpus/0"),
		noEndpoint("GET", "/v1/sim/gpus/0", "/v1/sim/gpus/0"),
	} {
		status, hdr, body := rawRequest(t, "unix", plainSock, tc.Method, tc.Target, tc.Body)
		testutil.CheckRoute(t, tc, status, hdr, body)
	}
}

// TestIdentityBeforeRouting: a request without a caller's identity is
// refused before any route is looked up, unknown paths included.
func TestIdentityBeforeRouting(t *testing.T) {
	s := New(partsOf(newFakeCore(t)), -1, slog.New(slog.DiscardHandler))
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
	srv := New(partsOf(newFakeCore(t)), -1, slog.New(slog.DiscardHandler)).ReadOnlyHTTPServer(false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	notAllowed := func(method, target string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 405, Allow: "GET, HEAD",
			Message: fmt.Sprintf("%s is not allowed on %s (allowed: GET)", method, target)}
	}
	notHere := func(method, target, path string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 404,
			Message: "no such endpoint here: " + path + " (over TCP gpuletd serves only GET /v1/snapshot, /v1/gpus and /metrics; the rest is on its Unix socket)"}
	}
	for _, tc := range []testutil.Route{
		{Method: "GET", Target: "/v1/snapshot", Status: 200},
		{Method: "GET", Target: "/v1/gpus", Status: 200},
		{Method: "GET", Target: "/metrics", Status: 200},
		{Method: "HEAD", Target: "/v1/snapshot", Status: 200},
		{Method: "HEAD", Target: "/v1/gpus", Status: 200},
		{Method: "HEAD", Target: "/metrics", Status: 200},
		{Method: "GET", Target: "/v1/snapshot?after=x", Status: 400},
		{Method: "GET", Target: "/v1%2Fsnapshot", Status: 200},
		{Method: "GET", Target: "/v1/%73napshot", Status: 200},
		{Method: "GET", Target: "http://gpulet/metrics", Status: 200},
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
		status, hdr, body := rawRequest(t, "tcp", ln.Addr().String(), tc.Method, tc.Target, tc.Body)
		testutil.CheckRoute(t, tc, status, hdr, body)
	}
}
