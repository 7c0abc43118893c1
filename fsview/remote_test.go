package fsview

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// fakeDaemon answers the three requests a Remote makes as gpuletd does:
// GET /v1/snapshot with an ETag and 304 for If-None-Match of the current one,
// GET /v1/leases and GET /metrics. It counts the snapshots it sent whole.
type fakeDaemon struct {
	mu     sync.Mutex
	snap   *api.Snapshot
	leases []api.Lease
	sent   atomic.Int64
	down   atomic.Bool
	// noLeases makes GET /v1/leases fail.
	noLeases atomic.Bool
}

func (f *fakeDaemon) set(free int, leases ...api.Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq := uint64(1)
	if f.snap != nil {
		seq = f.snap.Seq + 1
	}
	s := testSnapshot(seq, free)
	f.snap, f.leases = s, leases
}

func (f *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.down.Load() {
		http.Error(w, `{"error":{"code":"unavailable","message":"starting"}}`, http.StatusServiceUnavailable)
		return
	}
	f.mu.Lock()
	s, leases := f.snap, f.leases
	f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/snapshot":
		tag := fmt.Sprintf(`"%s-%d"`, s.BootID, s.Seq)
		w.Header().Set("ETag", tag)
		if r.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		f.sent.Add(1)
		b, _ := json.Marshal(s)
		w.Write(append(b, '\n'))
	case "/v1/leases":
		if f.noLeases.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(api.LeaseList{Leases: leases})
	case "/metrics":
		fmt.Fprintf(w, "gpulet_units_free %d\n", s.UnitsFree)
	default:
		http.NotFound(w, r)
	}
}

// serveFake serves f on a Unix socket and returns its path.
func serveFake(t *testing.T, f *fakeDaemon) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "gpulet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// A Remote asks for the snapshot at every Load and is sent it whole only
// when it changed; what it holds, its leases (by id) and its metrics are
// gpuletd's.
func TestRemoteRevalidatesEveryLoad(t *testing.T) {
	f := &fakeDaemon{}
	f.set(5, testLease("l-b", 1), testLease("l-a", 2))
	r := NewRemote(serveFake(t, f), quietLogger())
	if r.Latest() != nil {
		t.Fatal("Latest before any Load")
	}
	p := r.Load()
	if p == nil || p.Snapshot.UnitsFree != 5 || r.Latest() != p {
		t.Fatalf("first Load: %+v", p)
	}
	// The lease list is asked for on first use, so here, before the node
	// changes below.
	ls := p.Leases()
	if len(ls) != 2 || ls[0].ID != "l-a" || ls[1].ID != "l-b" {
		t.Errorf("leases %+v, want l-a and l-b, by id", ls)
	}
	want, _ := json.Marshal(p.Snapshot)
	if string(p.JSON()) != string(want)+"\n" {
		t.Errorf("JSON is not the bytes gpuletd sent:\n%s", p.JSON())
	}
	if again := r.Load(); again != p || f.sent.Load() != 1 {
		t.Fatalf("unchanged: Load gave %p (had %p), %d snapshots sent", again, p, f.sent.Load())
	}
	f.set(3)
	if p2 := r.Load(); p2 == p || p2.Snapshot.UnitsFree != 3 || r.Latest() != p2 {
		t.Fatalf("after a change: %+v", p2.Snapshot)
	}
	if m := string(r.Load().Metrics()); m != "gpulet_units_free 3\n" {
		t.Errorf("metrics %q", m)
	}
}

// While gpuletd does not answer, or refuses, Load has nothing to give.
func TestRemoteWithoutDaemon(t *testing.T) {
	r := NewRemote(filepath.Join(t.TempDir(), "nobody.sock"), quietLogger())
	if p := r.Load(); p != nil {
		t.Fatalf("Load with no daemon: %+v", p)
	}
	f := &fakeDaemon{}
	f.set(1)
	f.down.Store(true)
	if p := NewRemote(serveFake(t, f), quietLogger()).Load(); p != nil {
		t.Fatalf("Load of a daemon answering 503: %+v", p)
	}
}

// A view mounted over a Remote shows every change made before a read.
func TestMountOverRemote(t *testing.T) {
	requireFUSE(t)
	f := &fakeDaemon{}
	f.set(7, testLease("l-1", leaseOwner()))
	r := NewRemote(serveFake(t, f), quietLogger())
	_, dir := mountView(t, r)
	for free := 7; free > 4; free-- {
		f.set(free)
		if got := readFile(t, filepath.Join(dir, "free_units")); got != fmt.Sprintf("%d\n", free) {
			t.Fatalf("free_units = %q after the daemon went to %d", got, free)
		}
	}
	f.set(4, testLease("l-2", leaseOwner()))
	if names := dirNames(t, filepath.Join(dir, "leases")); len(names) != 1 || names[0] != "l-2" {
		t.Fatalf("leases/ = %v, want l-2", names)
	}
	// Attributes come from the snapshot last loaded for latestFor at most:
	// after that, a stat asks again. The last load is made that old by hand.
	f.set(10)
	r.mu.Lock()
	r.asked = r.asked.Add(-latestFor)
	r.mu.Unlock()
	if fi, err := os.Stat(filepath.Join(dir, "free_units")); err != nil || fi.Size() != int64(len("10\n")) {
		t.Fatalf("stat free_units after the node changed: %v, %v", fi, err)
	}
}

// A lease list that could not be had is not kept with its snapshot: the next
// Load asks for the snapshot whole, and its list, again.
func TestRemoteAsksAgainAfterAFailedList(t *testing.T) {
	f := &fakeDaemon{}
	f.set(5, testLease("l-a", 1))
	r := NewRemote(serveFake(t, f), quietLogger())
	f.noLeases.Store(true)
	if ls := r.Load().Leases(); len(ls) != 0 {
		t.Fatalf("leases while the list fails: %+v", ls)
	}
	f.noLeases.Store(false)
	p := r.Load()
	if f.sent.Load() != 2 {
		t.Fatalf("%d snapshots sent, want the snapshot asked for whole again", f.sent.Load())
	}
	if ls := p.Leases(); len(ls) != 1 || ls[0].ID != "l-a" {
		t.Fatalf("leases after the list works again: %+v", ls)
	}
}
