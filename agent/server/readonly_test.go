package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

// Over TCP only the read-only endpoints answer; leasing and the admin routes
// are not there at all.
func TestReadOnlyOverTCP(t *testing.T) {
	core := newFakeCore(t)
	srv := New(partsOf(core), -1, slog.New(slog.DiscardHandler)).ReadOnlyHTTPServer(false)
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

// Over TCP the snapshot, the GPUs and the metrics are redacted by default:
// no uid of a user of the GPUs and no reservation name reaches a network
// peer; with full detail asked for they do.
func TestReadOnlyRedactsByDefault(t *testing.T) {
	uid := uint32(4242)
	s := &api.Snapshot{Schema: api.SnapshotSchema, Node: "n", BootID: "b", Seq: 1, GPUs: []api.GPU{{
		Index: 0, UUID: "GPU-x", UnitsOffline: 3, OfflineByUID: map[string]int{"4242": 3},
		Instances:        []api.Instance{{Instance: 0, UID: &uid, Servers: []api.MPSServer{{PID: 5555, UID: &uid, Clients: 1}}, SlurmJobs: []uint64{918273}}},
		Claims:           []api.Claim{{Instance: 0, Units: []int{3}, UID: uid, PID: 7777, Usage: &api.Usage{PIDs: []int{7777}}}},
		OutsideProcesses: []api.GPUProcess{{PID: 6666, MemoryUsedMiB: 100}}, OutsideMemoryMiB: 100,
	}}, Reservations: []api.ReservationStatus{{Name: "secret-project", Reserved: 4}},
		OverQuota: []api.QuotaOver{{Quota: "alice", Limit: 1, Held: 2}, {Quota: "group:ml-team", Limit: 2, Held: 3}, {Quota: "*", Limit: 8, Held: 9}}}
	core := newFakeCore(t)
	core.store.Store(snapshot.New(s, nil, func(s *api.Snapshot) []byte { return metrics.Render(s, metrics.Leases{}) }))
	srv := New(partsOf(core), -1, slog.New(slog.DiscardHandler))
	get := func(h http.Handler, path string) string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	secrets := []string{"4242", "secret-project", "offline_by_uid", `"uid"`, "5555", "6666", "7777", "alice", "ml-team", "918273"}
	redacted := srv.ReadOnlyHTTPServer(false).Handler
	for _, path := range []string{"/v1/snapshot", "/v1/gpus", "/metrics"} {
		body := get(redacted, path)
		for _, secret := range secrets {
			if strings.Contains(body, secret) {
				t.Errorf("redacted %s shows %s:\n%s", path, secret, body)
			}
		}
	}
	var got api.Snapshot
	if err := json.Unmarshal([]byte(get(redacted, "/v1/snapshot")), &got); err != nil {
		t.Fatal(err)
	}
	if got.GPUs[0].UnitsOffline != 3 || got.GPUs[0].OutsideMemoryMiB != 100 || len(got.GPUs[0].Instances[0].Servers) != 1 || len(got.Reservations) != 1 || got.Reservations[0].Reserved != 4 || len(got.GPUs[0].Instances) != 1 {
		t.Fatalf("the redacted snapshot lost its counts: %+v", got)
	}
	// A quota over its limit stays, counts and all, without the user or
	// group it names; the node-wide "*" names nobody.
	if len(got.OverQuota) != 3 || got.OverQuota[0] != (api.QuotaOver{Limit: 1, Held: 2}) || got.OverQuota[2].Quota != "*" {
		t.Fatalf("the redacted snapshot's over_quota: %+v", got.OverQuota)
	}
	if m := get(redacted, "/metrics"); !strings.Contains(m, `gpulet_quota_over_units{quota="*"} 1`) {
		t.Errorf("redacted metrics lack the node-wide quota:\n%s", m)
	}
	full := get(srv.ReadOnlyHTTPServer(true).Handler, "/v1/snapshot")
	for _, secret := range secrets {
		if !strings.Contains(full, secret) {
			t.Errorf("full detail lacks %s", secret)
		}
	}
	if s.GPUs[0].OfflineByUID == nil || s.GPUs[0].Instances[0].UID == nil || s.Reservations[0].Name == "" || s.OverQuota[0].Quota != "alice" || s.GPUs[0].Instances[0].SlurmJobs == nil {
		t.Fatal("redacting changed the published snapshot")
	}
}
