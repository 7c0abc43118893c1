package reporter

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/snapshot"
)

// source is a snapshot store the test moves by hand.
type source struct {
	store snapshot.Store
	mu    sync.Mutex
	seq   uint64
	boot  string
}

func newSource() *source {
	s := &source{boot: "boot-a"}
	s.change()
	return s
}

func (s *source) change() {
	s.mu.Lock()
	s.seq++
	snap := &api.Snapshot{Schema: api.SnapshotSchema, Node: "n1", BootID: s.boot, Seq: s.seq}
	s.mu.Unlock()
	s.store.Store(snapshot.New(snap, nil, nil))
	s.store.Invalidate()
}

func (s *source) Published() *snapshot.Published { return s.store.Load() }
func (s *source) Changed() <-chan struct{}       { return s.store.Changed() }

// receiver records what it was pushed.
type receiver struct {
	mu     sync.Mutex
	seqs   []uint64
	auth   []string
	status int // answer; 0: 204
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var s api.Snapshot
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" || json.Unmarshal(b, &s) != nil {
		http.Error(w, "bad push", 400)
		return
	}
	if r.status != 0 {
		http.Error(w, "down for maintenance", r.status)
		return
	}
	r.seqs = append(r.seqs, s.Seq)
	r.auth = append(r.auth, req.Header.Get("Authorization"))
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) got() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.seqs...)
}

func start(t *testing.T, cfg Config, src Source) *Sender {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// A change goes out at once after a quiet spell, every interval the current
// snapshot goes again, and seqs never go back.
func TestPushOnChangeAndInterval(t *testing.T) {
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	start(t, Config{URL: srv.URL, Interval: 200 * time.Millisecond}, src)
	testutil.Eventually(t, "the first push", func() bool { return len(rcv.got()) >= 1 })
	time.Sleep(300 * time.Millisecond) // quiet
	src.change()
	testutil.Eventually(t, "the change pushed", func() bool { g := rcv.got(); return len(g) > 0 && g[len(g)-1] == 2 })
	n := len(rcv.got())
	time.Sleep(700 * time.Millisecond)
	if g := rcv.got(); len(g)-n < 2 {
		t.Fatalf("%d pushes in 700ms of quiet with a 200ms interval, want at least 2: %v", len(g)-n, g)
	}
	g := rcv.got()
	for i := 1; i < len(g); i++ {
		if g[i] < g[i-1] {
			t.Fatalf("seq went back: %v", g)
		}
	}
}

// A storm of changes is coalesced to at most ten pushes a second, the last
// of which carries the newest snapshot.
func TestPushCoalescesChurn(t *testing.T) {
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	start(t, Config{URL: srv.URL, Interval: time.Hour}, src)
	testutil.Eventually(t, "the first push", func() bool { return len(rcv.got()) >= 1 })
	begin := time.Now()
	for time.Since(begin) < time.Second {
		src.change()
		time.Sleep(200 * time.Microsecond)
	}
	elapsed := time.Since(begin)
	final := src.Published().Snapshot.Seq
	testutil.Eventually(t, "the newest snapshot pushed", func() bool { g := rcv.got(); return g[len(g)-1] == final })
	pushes := len(rcv.got()) - 1
	if limit := int(elapsed/minGap) + 2; pushes > limit {
		t.Fatalf("%d pushes for %d changes in %s, want at most %d", pushes, final, elapsed, limit)
	}
}

// A failing receiver is retried with backoff; the sender says so; once the
// receiver works again the newest snapshot goes out.
func TestPushRetriesAndRecovers(t *testing.T) {
	src := newSource()
	rcv := &receiver{status: 503}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	var changes atomic.Int32
	s := start(t, Config{URL: srv.URL, Interval: time.Hour, OnStateChange: func() { changes.Add(1) }}, src)
	testutil.Eventually(t, "failures counted", func() bool { return s.Status().Failures >= 2 })
	if n := changes.Load(); n != 1 {
		t.Fatalf("OnStateChange called %d times while failing, want once", n)
	}
	if st := s.Status(); st.LastError == "" || st.LastSuccess != nil {
		t.Fatalf("status while failing: %+v", st)
	}
	src.change()
	rcv.mu.Lock()
	rcv.status = 0
	rcv.mu.Unlock()
	testutil.Eventually(t, "the newest pushed after recovery", func() bool { g := rcv.got(); return len(g) > 0 && g[len(g)-1] == 2 })
	testutil.Eventually(t, "status recovered", func() bool {
		st := s.Status()
		return st.Failures == 0 && st.LastError == "" && st.LastSuccess != nil && st.LastSeq == 2 && st.Pushes >= 1
	})
	testutil.Eventually(t, "the recovery told", func() bool { return changes.Load() == 2 })
}

// A receiver that accepts and never answers holds up neither another
// upstream nor the source.
func TestHangingReceiverHoldsUpNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP:", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	start(t, Config{URL: "http://" + ln.Addr().String(), Interval: time.Hour}, src)
	start(t, Config{URL: srv.URL, Interval: time.Hour}, src)
	for range 5 {
		src.change()
		time.Sleep(150 * time.Millisecond)
	}
	testutil.Eventually(t, "the good upstream has the newest", func() bool { g := rcv.got(); return len(g) > 0 && g[len(g)-1] == 6 })
}

// The bearer token comes from its file and is read again when it changes.
func TestPushToken(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	start(t, Config{URL: srv.URL, Interval: time.Hour, TokenFile: tok}, src)
	testutil.Eventually(t, "a push", func() bool { return len(rcv.got()) >= 1 })
	if err := os.WriteFile(tok, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	src.change()
	testutil.Eventually(t, "a push with the new token", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return len(rcv.auth) >= 2 && rcv.auth[len(rcv.auth)-1] == "Bearer second-token"
	})
	rcv.mu.Lock()
	first := rcv.auth[0]
	rcv.mu.Unlock()
	if first != "Bearer first" {
		t.Fatalf("first push's Authorization %q", first)
	}
}

// An https upstream with a private CA is trusted through --upstream-ca, and
// not without it.
func TestPushPrivateCA(t *testing.T) {
	rcv := &receiver{}
	srv := httptest.NewTLSServer(rcv)
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	src := newSource()
	untrusted := start(t, Config{URL: srv.URL, Interval: time.Hour}, src)
	start(t, Config{URL: srv.URL, Interval: time.Hour, CAFile: ca}, src)
	testutil.Eventually(t, "a push through the private CA", func() bool { return len(rcv.got()) >= 1 })
	testutil.Eventually(t, "the sender without the CA failing", func() bool { return untrusted.Status().Failures >= 1 })
	if _, err := New(Config{URL: srv.URL, CAFile: filepath.Join(t.TempDir(), "none.pem")}, src); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

func TestCheckURL(t *testing.T) {
	for _, good := range []string{"http://s:8080/v1/snapshots", "https://scheduler.example/x"} {
		if err := CheckURL(good); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
	for _, bad := range []string{"", "scheduler:8080", "ftp://s/x", "http://", "://x", "unix:///run/x.sock"} {
		if err := CheckURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{"http://s:8080/v1/snapshots", "https://x", "ftp://s", "", "http://[::1]:80/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { CheckURL(s) })
}
