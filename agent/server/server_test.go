package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/snapshot"
)

// fakeCore is a map-backed Core that records who called.
type fakeCore struct {
	mu     sync.Mutex
	leases map[string]api.Lease
	peers  []identity.Peer
	// pidfdStart is, per request that came with a pidfd, the start time of
	// its process (0: not a live process).
	pidfdStart []uint64
	draining   bool
	// cleared lists the GPUs ClearXid was asked for.
	cleared []string
	sim     bool
	pub     *snapshot.Published
	// store publishes pub and what publish changes it to.
	store snapshot.Store
	// reservations are by name; their owner may advance and end them.
	reservations map[string]api.Reservation
}

func newFakeCore(t *testing.T) *fakeCore {
	s := &api.Snapshot{Schema: api.SnapshotSchema, Node: "n", Seq: 1, GPUs: []api.GPU{{Index: 0, UUID: "GPU-x"}}}
	p := snapshot.New(s, nil, func(*api.Snapshot) []byte { return []byte("gpulet_x 1\n") })
	f := &fakeCore{leases: map[string]api.Lease{}, pub: p, reservations: map[string]api.Reservation{}}
	f.store.Store(p)
	return f
}

// publish makes a snapshot of seq the current one, as a change would.
func (f *fakeCore) publish(seq uint64) {
	s := *f.pub.Snapshot
	s.Seq = seq
	f.store.Store(snapshot.New(&s, nil, nil))
	f.store.Invalidate()
}

func (f *fakeCore) Load() *snapshot.Published { return f.store.Load() }
func (f *fakeCore) Changed() <-chan struct{}  { return f.store.Changed() }
func (f *fakeCore) Acquire(_ context.Context, p identity.Peer, r lease.Request) (lease.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = append(f.peers, p)
	if p.PIDFD != nil {
		// While the request lasts, the pidfd holds the process that
		// connected (this one, alive).
		var st uint64
		if proc, st2, err := procwatch.Adopt(p.PIDFD, p.PID); err == nil {
			st = st2
			proc.Close()
		}
		f.pidfdStart = append(f.pidfdStart, st)
	}
	if r.Units > 4 {
		return lease.Grant{}, api.Errorf(api.ErrInsufficientUnits, "no GPU can take %d", r.Units)
	}
	l := api.Lease{ID: "l-1", Units: make([]int, r.Units), Owner: api.Owner{UID: p.UID, PID: p.PID}}
	f.leases[l.ID] = l
	b, err := json.Marshal(l)
	return lease.Grant{Lease: l, JSON: b}, err
}
func (f *fakeCore) List(identity.Peer) []api.Lease { return []api.Lease{} }
func (f *fakeCore) Get(_ identity.Peer, id string) (api.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	if !ok {
		return l, api.Errorf(api.ErrNotFound, "no lease %q", id)
	}
	return l, nil
}
func (f *fakeCore) Renew(p identity.Peer, id string) (api.Lease, error) { return f.Get(p, id) }
func (f *fakeCore) Release(p identity.Peer, id string) error {
	_, err := f.Get(p, id)
	return err
}
func (f *fakeCore) Reserve(p identity.Peer, s reserve.Spec) (api.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.reservations[s.Name]; dup {
		return api.Reservation{}, api.Errorf(api.ErrConflict, "name: a reservation named %q exists already", s.Name)
	}
	r := api.Reservation{ReservationStatus: api.ReservationStatus{Name: s.Name, State: api.ReservationActive, Reserved: s.Size(), Need: s.Needs[0], Stages: len(s.Needs)},
		Owner: api.ReservationOwner{UID: p.UID, GID: p.GID}, Needs: s.Needs}
	f.reservations[s.Name] = r
	return r, nil
}
func (f *fakeCore) Reservations() []api.Reservation {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Reservation
	for _, r := range f.reservations {
		out = append(out, r)
	}
	return out
}
func (f *fakeCore) Reservation(name string) (api.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reservations[name]
	if !ok {
		return r, api.Errorf(api.ErrNotFound, "no reservation named %q", name)
	}
	return r, nil
}
func (f *fakeCore) managed(p identity.Peer, name string) (api.Reservation, error) {
	r, err := f.Reservation(name)
	if err == nil && p.UID != r.Owner.UID && !p.Admin {
		err = api.Errorf(api.ErrForbidden, "reservation %q is not yours", name)
	}
	return r, err
}
func (f *fakeCore) Advance(p identity.Peer, name string) (api.Reservation, error) {
	r, err := f.managed(p, name)
	if err != nil {
		return r, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r.Stage++
	f.reservations[name] = r
	return r, nil
}
func (f *fakeCore) Unreserve(p identity.Peer, name string) error {
	if _, err := f.managed(p, name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reservations, name)
	return nil
}
func (f *fakeCore) SetDraining(on bool) { f.draining = on }
func (f *fakeCore) ClearXid(gpu string) (int, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if gpu != "0" && gpu != "GPU-x" {
		return 0, 0, api.Errorf(api.ErrBadRequest, "gpu: no GPU %q", gpu)
	}
	f.cleared = append(f.cleared, gpu)
	return 0, 79, nil
}
func (f *fakeCore) SimGPU() func(int, api.SimGPUUpdate) error {
	if !f.sim {
		return nil
	}
	return func(i int, u api.SimGPUUpdate) error {
		if i != 0 {
			return api.Errorf(api.ErrNotFound, "no simulated GPU %d", i)
		}
		return nil
	}
}

func (f *fakeCore) Explain(p identity.Peer, r lease.Request) (api.Placement, error) {
	if r.Pool != "" {
		return api.Placement{}, api.Errorf(api.ErrForbidden, "pool %s: uid %d may not lease there", r.Pool, p.UID)
	}
	return api.Placement{GPU: api.LeaseGPU{Index: 0, UUID: "GPU-x"}, Units: []int{0}, Policy: "best-fit", Candidates: []api.Candidate{{GPU: 0, Kept: true}}}, nil
}
func (f *fakeCore) Profiles(identity.Peer) api.ProfileList {
	return api.ProfileList{Profiles: []api.TaskProfile{{Task: "t", Models: []api.ModelRunTime{{Model: "Tesla T4", Seconds: 2, Runs: 1}}}}}
}
func (f *fakeCore) Pools(p identity.Peer) api.PoolList {
	return api.PoolList{Pools: []api.Pool{{Name: "p", GPUs: []int{0}, UnitsFree: 3, Allowed: p.Admin}}}
}
func (f *fakeCore) Quotas(p identity.Peer) api.QuotaList {
	return api.QuotaList{Admin: p.Admin, Quotas: []api.QuotaUsage{{Quota: "*", Limit: 8, Held: 1}}}
}

// fake is all a fake gives the API: every part of Parts, the features'
// calls under names of their own (fakeFeatures).
type fake interface {
	Snapshots
	Leases
	Core
	fakeFeatures
	SimGPU() func(int, api.SimGPUUpdate) error
}

// fakeFeatures are the Slurm and reservation calls of a fake.
type fakeFeatures interface {
	ReleaseSlurmJob(peer identity.Peer, job uint64) ([]string, error)
	Reserve(peer identity.Peer, spec reserve.Spec) (api.Reservation, error)
	Reservations() []api.Reservation
	Reservation(name string) (api.Reservation, error)
	Advance(peer identity.Peer, name string) (api.Reservation, error)
	Unreserve(peer identity.Peer, name string) error
}

// fakeSlurm and fakeReservations answer the features' parts with a fake's.
type fakeSlurm struct{ fakeFeatures }

func (f fakeSlurm) ReleaseJob(p identity.Peer, job uint64) ([]string, error) {
	return f.ReleaseSlurmJob(p, job)
}

type fakeReservations struct{ fakeFeatures }

func (f fakeReservations) List() []api.Reservation                  { return f.Reservations() }
func (f fakeReservations) Get(name string) (api.Reservation, error) { return f.Reservation(name) }

// partsOf is the API's parts, all answered by f.
func partsOf(f fake) Parts {
	return Parts{Snapshots: f, Leases: f, SlurmJobs: fakeSlurm{f}, Reservations: fakeReservations{f}, Core: f, SimGPU: f.SimGPU()}
}

// serve runs the API on a real Unix socket, so that SO_PEERCRED is real. The
// test's own group is the admin group, so that the test is an admin run as
// any user, as root is.
func serve(t *testing.T, core fake) *http.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(partsOf(core), os.Getgid(), slog.New(slog.NewTextHandler(io.Discard, nil))).HTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

func do(t *testing.T, c *http.Client, method, path, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://gpulet"+path, strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestRoutes(t *testing.T) {
	core := newFakeCore(t)
	c := serve(t, core)
	tests := []struct {
		name, method, path, body string
		status                   int
		code, contains           string
	}{
		{"snapshot", "GET", "/v1/snapshot", "", 200, "", `"schema":"gpulet.snapshot/v1"`},
		{"gpus", "GET", "/v1/gpus", "", 200, "", `"uuid":"GPU-x"`},
		{"metrics", "GET", "/metrics", "", 200, "", "gpulet_x 1"},
		{"lease", "POST", "/v1/leases", `{"units":2}`, 201, "", `"id":"l-1"`},
		{"lease bad body", "POST", "/v1/leases", `{"units":"x"}`, 400, api.CodeBadRequest, "units"},
		{"lease too big", "POST", "/v1/leases", `{"units":9}`, 409, api.CodeInsufficientUnits, "no GPU can take 9"},
		{"get missing", "GET", "/v1/leases/l-nope", "", 404, api.CodeNotFound, "l-nope"},
		{"release missing", "DELETE", "/v1/leases/l-nope", "", 404, api.CodeNotFound, ""},
		{"renew missing", "POST", "/v1/leases/l-nope/renew", "", 404, api.CodeNotFound, ""},
		{"unknown path", "GET", "/v1/nothing", "", 404, api.CodeNotFound, "no such endpoint"},
		{"wrong method", "PUT", "/v1/snapshot", "", 405, api.CodeMethodNotAllowed, "GET"},
		{"sim absent on real backend", "POST", "/v1/sim/gpus/0", `{"utilization_pct":5}`, 404, api.CodeNotFound, ""},
		{"drain", "POST", "/v1/node/drain", "", 200, "", "schema"},
		{"dry run", "POST", "/v1/placements", `{"units":1}`, 200, "", `"candidates":[{"gpu":0,"kept":true}]`},
		{"dry run bad body", "POST", "/v1/placements", `{"units":0}`, 400, api.CodeBadRequest, "units"},
		{"dry run refused", "POST", "/v1/placements", `{"units":1,"pool":"p"}`, 403, api.CodeForbidden, "may not lease there"},
		{"profiles", "GET", "/v1/profiles", "", 200, "", `"models":[{"model":"Tesla T4","seconds":2,"runs":1}]`},
		{"pools", "GET", "/v1/pools", "", 200, "", `"units_free":3,"allowed":true`},
		{"quotas", "GET", "/v1/quotas", "", 200, "", `"quotas":[{"quota":"*","limit":8,"held":1}]`},
		{"no reservations", "GET", "/v1/reservations", "", 200, "", `{"reservations":[]}`},
		{"reserve", "POST", "/v1/reservations", `{"name":"wf1","stages":[2,[3,3],6,8]}`, 201, "", `"reserved":8`},
		{"reserve again", "POST", "/v1/reservations", `{"name":"wf1","stages":[1]}`, 409, api.CodeConflict, "exists already"},
		{"reserve bad stage", "POST", "/v1/reservations", `{"name":"wf2","stages":[2,0]}`, 400, api.CodeBadRequest, "stages[1]"},
		{"reserve no stages", "POST", "/v1/reservations", `{"name":"wf2"}`, 400, api.CodeBadRequest, "stages: empty"},
		{"reservations", "GET", "/v1/reservations", "", 200, "", `"name":"wf1"`},
		{"reservation", "GET", "/v1/reservations/wf1", "", 200, "", `"needs":[2,6,6,8]`},
		{"reservation missing", "GET", "/v1/reservations/nope", "", 404, api.CodeNotFound, "nope"},
		{"advance", "POST", "/v1/reservations/wf1/advance", "", 200, "", `"stage":1`},
		{"advance missing", "POST", "/v1/reservations/nope/advance", "", 404, api.CodeNotFound, ""},
		{"unreserve", "DELETE", "/v1/reservations/wf1", "", 204, "", ""},
		{"unreserve again", "DELETE", "/v1/reservations/wf1", "", 404, api.CodeNotFound, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := do(t, c, tc.method, tc.path, tc.body)
			if status != tc.status || !strings.Contains(body, tc.contains) {
				t.Fatalf("%s %s = %d %s; want %d containing %q", tc.method, tc.path, status, body, tc.status, tc.contains)
			}
			if tc.code != "" {
				var eb api.ErrorBody
				if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error.Code != tc.code || eb.Error.Message == "" {
					t.Fatalf("error body %s, want code %q", body, tc.code)
				}
				if hdr.Get("Content-Type") != "application/json" {
					t.Fatalf("error content type %q", hdr.Get("Content-Type"))
				}
			}
		})
	}
	if string(mustGet(t, c, "/v1/snapshot")) != string(core.pub.JSON()) {
		t.Fatal("snapshot bytes differ from the published ones")
	}
}

func mustGet(t *testing.T, c *http.Client, path string) []byte {
	_, _, b := do(t, c, "GET", path, "")
	return []byte(b)
}

func TestPeerCredentialsComeFromTheSocket(t *testing.T) {
	core := newFakeCore(t)
	c := serve(t, core)
	do(t, c, "POST", "/v1/leases", `{"units":1}`)
	if len(core.peers) != 1 || core.peers[0].PID != os.Getpid() || core.peers[0].UID != uint32(os.Getuid()) {
		t.Fatalf("peer %+v, want this process (pid %d uid %d)", core.peers, os.Getpid(), os.Getuid())
	}
}

// TestProcessBoundLeaseGetsTheCallersPidfd: a lease bound to the caller's own
// process comes to the core with a pidfd of the process that connected,
// closed once the request is done; a ttl lease or a "pid" gets none.
func TestProcessBoundLeaseGetsTheCallersPidfd(t *testing.T) {
	core := newFakeCore(t)
	c := serve(t, core)
	do(t, c, "POST", "/v1/leases", `{"units":1}`)
	do(t, c, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`)
	do(t, c, "POST", "/v1/leases", fmt.Sprintf(`{"units":1,"pid":%d}`, os.Getpid()))
	me, err := procwatch.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(core.peers) != 3 || len(core.pidfdStart) != 1 || core.pidfdStart[0] != me {
		t.Fatalf("pidfds with start times %v over %d requests, want one of this process (start %d)", core.pidfdStart, len(core.peers), me)
	}
	if fd := core.peers[0].PIDFD.Fd(); fd != ^uintptr(0) {
		t.Fatalf("the request's pidfd (fd %d) is still open after the answer", fd)
	}
}

func TestBodyLimit(t *testing.T) {
	c := serve(t, newFakeCore(t))
	big := `{"units":1,"task":"` + strings.Repeat("a", MaxRequestBody) + `"}`
	status, _, body := do(t, c, "POST", "/v1/leases", big)
	if status != 413 || !strings.Contains(body, api.CodeRequestTooLarge) {
		t.Fatalf("oversized body: %d %s", status, body)
	}
}

func TestSimRouteOnlyOnSimulatedBackend(t *testing.T) {
	core := newFakeCore(t)
	core.sim = true
	c := serve(t, core)
	status, _, body := do(t, c, "POST", "/v1/sim/gpus/0", `{"utilization_pct":95}`)
	want := 200
	if os.Getuid() != 0 {
		want = 403
	}
	if status != want {
		t.Fatalf("sim set as uid %d: %d %s", os.Getuid(), status, body)
	}
	if status, _, _ := do(t, c, "POST", "/v1/sim/gpus/0", `{"bogus":1}`); os.Getuid() == 0 && status != 400 {
		t.Fatalf("bad sim body: %d", status)
	}
}

func TestUndrain(t *testing.T) {
	core := newFakeCore(t)
	c := serve(t, core)
	core.draining = true
	if status, _, body := do(t, c, "POST", "/v1/node/undrain", `{"gpu":"0"}`); status != 200 || !strings.Contains(body, "schema") {
		t.Fatalf("undrain of GPU 0: %d %s", status, body)
	}
	if !core.draining || strings.Join(core.cleared, ",") != "0" {
		t.Fatalf("undrain of GPU 0: draining %v (want it left on), cleared %q", core.draining, core.cleared)
	}
	if status, _, body := do(t, c, "POST", "/v1/node/undrain", ` {"gpu":"GPU-x"}`+"\n"); status != 200 || strings.Join(core.cleared, ",") != "0,GPU-x" {
		t.Fatalf("undrain by UUID: %d %s, cleared %q", status, body, core.cleared)
	}
	for _, tc := range []struct{ name, body, contains string }{
		{"unknown GPU", `{"gpu":"9"}`, `no GPU \"9\"`},
		{"empty gpu", `{"gpu":""}`, "an empty body resumes the node"},
		{"empty object", `{}`, "give a GPU index or UUID"},
		{"null", `null`, "give a GPU index or UUID"},
		{"number", `{"gpu":0}`, "gpu: must be a string"},
		{"unknown field", `{"gpu":"0","all":true}`, `unknown field \"all\"`},
		{"trailing data", `{"gpu":"0"} {"gpu":"1"}`, "trailing data"},
		{"not JSON", `gpu=0`, "malformed JSON"},
	} {
		status, _, body := do(t, c, "POST", "/v1/node/undrain", tc.body)
		if status != 400 || !strings.Contains(body, api.CodeBadRequest) || !strings.Contains(body, tc.contains) {
			t.Errorf("%s: %d %s, want 400 containing %q", tc.name, status, body, tc.contains)
		}
	}
	if !core.draining || len(core.cleared) != 2 {
		t.Fatalf("a refused undrain changed something: draining %v, cleared %q", core.draining, core.cleared)
	}
	if status, _, body := do(t, c, "POST", "/v1/node/undrain", ""); status != 200 || core.draining {
		t.Fatalf("undrain without a body: %d %s, draining %v", status, body, core.draining)
	}
}

// TestUndrainIsForAdmins serves a caller that is not an admin, as the socket
// would have identified it.
func TestUndrainIsForAdmins(t *testing.T) {
	core := newFakeCore(t)
	core.draining = true
	srv := New(partsOf(core), -1, slog.New(slog.DiscardHandler))
	for _, body := range []string{"", `{"gpu":"0"}`} {
		req := httptest.NewRequest("POST", "/v1/node/undrain", strings.NewReader(body))
		req = req.WithContext(context.WithValue(req.Context(), connKey{}, &connInfo{peer: identity.Peer{UID: 1000, GID: 1000, PID: 1}}))
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != 403 || !strings.Contains(rec.Body.String(), api.CodeForbidden) {
			t.Errorf("undrain %q as a user: %d %s", body, rec.Code, rec.Body.String())
		}
	}
	if !core.draining || len(core.cleared) != 0 {
		t.Fatalf("a user's undrain changed something: draining %v, cleared %q", core.draining, core.cleared)
	}
}

func FuzzDecodeUndrain(f *testing.F) {
	for _, seed := range []string{"", " \n", `{"gpu":"0"}`, `{"gpu":"GPU-1234"}`, `{"gpu":""}`, `{}`, `null`, `{"gpu":0}`,
		`{"gpu":"0","x":1}`, `{"gpu":"0"}{}`, `[`, `{"gpu":"\u0000"}`, `"0"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeUndrain(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, api.ErrBadRequest) {
				t.Fatalf("%q: error %v is not a bad_request", b, err)
			}
			return
		}
		empty := len(bytes.TrimSpace(b)) == 0
		if empty != (req.GPU == "") {
			t.Fatalf("%q decoded to %+v", b, req)
		}
		if !empty {
			var back api.UndrainRequest
			if json.Unmarshal(b, &back) != nil || back != req {
				t.Fatalf("%q decoded to %+v, encoding/json reads %+v", b, req, back)
			}
		}
	})
}

// TestServerErrorsAreStructuredAndBudgeted: http.Server's own lines ("http:
// Accept error: ...") and internal-error lines go through the structured log,
// at most a budget a second, however many a caller causes.
func TestServerErrorsAreStructuredAndBudgeted(t *testing.T) {
	var buf testutil.SyncBuffer
	s := New(partsOf(newFakeCore(t)), -1, slog.New(slog.NewJSONHandler(&buf, nil)))
	srv := s.HTTPServer()
	for range 1000 {
		srv.ErrorLog.Printf("http: Accept error: accept unix /run/gpulet/gpulet.sock: accept4: too many open files; retrying in 5ms")
	}
	for range 1000 {
		s.writeError(httptest.NewRecorder(), errors.New("disk full"))
	}
	var accept, internal int
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a structured line: %q", line)
		}
		switch rec["msg"] {
		case "http server error":
			if !strings.HasPrefix(rec["err"].(string), "http: Accept error") {
				t.Fatalf("line %q", line)
			}
			accept++
		case "internal error answering a request":
			internal++
		}
	}
	// Two seconds' budget at most, should a slow machine cross a second.
	if accept < 1 || accept > 2*httpErrorsPerSecond || internal < 1 || internal > 2*internalLinesPerSecond {
		t.Fatalf("%d accept-error lines (budget %d) and %d internal-error lines (budget %d) from 1000 each", accept, httpErrorsPerSecond, internal, internalLinesPerSecond)
	}
}
