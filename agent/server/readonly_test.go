package server

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

// Over TCP only the read-only endpoints answer; leasing and the admin routes
// are not there at all.
func TestReadOnlyOverTCP(t *testing.T) {
	core := newFakeCore(t)
	srv := New(core, -1, slog.New(slog.DiscardHandler)).ReadOnlyHTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	base := "http://" + ln.Addr().String()
	get := func(method, path string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(`{"units":1}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if status, body, h := get("GET", "/v1/snapshot"); status != 200 || !strings.Contains(body, `"schema"`) || h.Get("ETag") == "" {
		t.Fatalf("GET /v1/snapshot: %d %s", status, body)
	}
	if status, body, _ := get("GET", "/v1/gpus"); status != 200 || !strings.Contains(body, "GPU-x") {
		t.Fatalf("GET /v1/gpus: %d %s", status, body)
	}
	if status, body, _ := get("GET", "/metrics"); status != 200 || body != "gpulet_x 1\n" {
		t.Fatalf("GET /metrics: %d %q", status, body)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/v1/leases", 404}, {"GET", "/v1/leases", 404}, {"POST", "/v1/node/drain", 404},
		{"POST", "/v1/sim/gpus/0", 404}, {"POST", "/v1/snapshot", 405}, {"DELETE", "/metrics", 405},
	} {
		if status, body, _ := get(tc.method, tc.path); status != tc.status {
			t.Errorf("%s %s over TCP: %d %s; want %d", tc.method, tc.path, status, body, tc.status)
		}
	}
	if core.draining || len(core.peers) != 0 {
		t.Fatal("a request over TCP reached the core's leasing or admin calls")
	}
}
