package reporter

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
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

func (s *source) Load() *snapshot.Published { return s.store.Load() }
func (s *source) Changed() <-chan struct{}  { return s.store.Changed() }

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

// testClock is a fake clock that also keeps every wait a sender arms on it,
// in order, so that a test sees what the sender waits for before it moves
// the time: a push that must not happen yet cannot, as no time passes.
type testClock struct {
	*clock.Fake
	mu    sync.Mutex
	waits []time.Duration
	seen  int // waits nextWait returned
}

func newTestClock() *testClock {
	return &testClock{Fake: clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))}
}

func (c *testClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	return t
}

// nextWait waits for the sender to arm its next wait and returns its length.
func (c *testClock) nextWait(t *testing.T) time.Duration {
	t.Helper()
	testutil.Eventually(t, "the sender to wait", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.waits) > c.seen
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen++
	return c.waits[c.seen-1]
}

// A change goes out at once after a quiet spell, every interval the current
// snapshot goes again (and not before), and seqs never go back.
func TestPushOnChangeAndInterval(t *testing.T) {
	const interval = 200 * time.Millisecond
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	clk := newTestClock()
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: interval, Clock: clk}, src)
	testutil.Eventually(t, "the first push", func() bool { return len(rcv.got()) >= 1 })
	if w := clk.nextWait(t); w != interval {
		t.Fatalf("after a push the sender waits %s, want the interval %s", w, interval)
	}
	// A quiet spell as long as the gap between pushes: the change then goes
	// out with no more time passing.
	clk.Advance(minGap)
	src.change()
	testutil.Eventually(t, "the change pushed at once", func() bool { return slices.Equal(rcv.got(), []uint64{1, 2}) })
	want := []uint64{1, 2}
	for range 2 {
		if w := clk.nextWait(t); w != interval {
			t.Fatalf("after push %d the sender waits %s, want the interval %s: %v", len(want), w, interval, rcv.got())
		}
		if g := rcv.got(); !slices.Equal(g, want) {
			t.Fatalf("pushes %v while the sender waits for the interval, want %v", g, want)
		}
		clk.Advance(interval)
		want = append(want, 2)
		testutil.Eventually(t, "the snapshot pushed again after the interval", func() bool { return len(rcv.got()) >= len(want) })
	}
	if w := clk.nextWait(t); w != interval {
		t.Fatalf("after push %d the sender waits %s, want the interval %s", len(want), w, interval)
	}
	if g := rcv.got(); !slices.Equal(g, want) {
		t.Fatalf("pushes %v, want %v: the current snapshot once per interval, seqs never going back", g, want)
	}
}

// A storm of changes is coalesced to at most one push per minGap (ten a
// second): a change right after a push waits out the gap, the changes made
// meanwhile wake nothing, and the push that ends the gap carries the newest.
func TestPushCoalescesChurn(t *testing.T) {
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	clk := newTestClock()
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, Clock: clk}, src)
	testutil.Eventually(t, "the first push", func() bool { return len(rcv.got()) >= 1 })
	want := []uint64{1}
	for round := range 3 {
		if w := clk.nextWait(t); w != time.Hour {
			t.Fatalf("round %d: after a push the sender waits %s, want the interval", round, w)
		}
		src.change()
		if w := clk.nextWait(t); w != minGap {
			t.Fatalf("round %d: a change right after a push waits %s, want %s: %v", round, w, minGap, rcv.got())
		}
		for range 100 {
			src.change()
		}
		final := src.Load().Snapshot.Seq
		clk.Advance(minGap)
		want = append(want, final)
		testutil.Eventually(t, "the newest snapshot pushed", func() bool { return len(rcv.got()) >= len(want) })
		if g := rcv.got(); !slices.Equal(g, want) {
			t.Fatalf("round %d: pushes %v, want %v: one push per gap, of the newest", round, g, want)
		}
	}
}

// A failing receiver is retried with backoff; the group says so, once when
// pushing starts failing and once when it works again; once the receiver
// works again the newest snapshot goes out.
func TestPushRetriesAndRecovers(t *testing.T) {
	src := newSource()
	rcv := &receiver{status: 503}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	g, err := NewGroup([]Config{{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)}}, src)
	if err != nil {
		t.Fatal(err)
	}
	failing := g.StateChanged()
	runGroup(t, g)
	status := func() api.UpstreamStatus { return g.Status()[0] }
	<-failing
	recovered := g.StateChanged()
	testutil.Eventually(t, "failures counted", func() bool { return status().Failures >= 2 })
	select {
	case <-recovered:
		t.Fatal("the state told changed again while failing")
	default:
	}
	if st := status(); st.LastError == "" || st.LastSuccess != nil {
		t.Fatalf("status while failing: %+v", st)
	}
	src.change()
	rcv.mu.Lock()
	rcv.status = 0
	rcv.mu.Unlock()
	testutil.Eventually(t, "the newest pushed after recovery", func() bool { g := rcv.got(); return len(g) > 0 && g[len(g)-1] == 2 })
	<-recovered
	testutil.Eventually(t, "status recovered", func() bool {
		st := status()
		return st.Failures == 0 && st.LastError == "" && st.LastSuccess != nil && st.LastSeq == 2 && st.Pushes >= 1
	})
}

// runGroup runs g until the test ends.
func runGroup(t *testing.T, g *Group) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A group publishes each upstream's status, in the order given, as a value
// that later pushes do not change; every push is in the next value, though
// only a change of failing or working is signalled.
func TestGroupPublishesStatus(t *testing.T) {
	src := newSource()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	g, err := NewGroup([]Config{
		{Upstream: mustUpstream(t, srv.URL+"/a?token=SECRET"), Interval: time.Hour, Logger: quiet},
		{Upstream: mustUpstream(t, srv.URL+"/b"), Interval: time.Hour, Logger: quiet},
	}, src)
	if err != nil {
		t.Fatal(err)
	}
	before := g.Status()
	if len(before) != 2 || before[0].URL != srv.URL+"/a?redacted" || before[1].URL != srv.URL+"/b" || before[0].Pushes != 0 {
		t.Fatalf("status before any push = %+v", before)
	}
	changed := g.StateChanged()
	runGroup(t, g)
	testutil.Eventually(t, "both pushed", func() bool { st := g.Status(); return st[0].Pushes == 1 && st[1].Pushes == 1 })
	src.change()
	testutil.Eventually(t, "both pushed the change", func() bool { st := g.Status(); return st[0].LastSeq == 2 && st[1].LastSeq == 2 })
	if before[0].Pushes != 0 || before[1].Pushes != 0 {
		t.Fatalf("a published status changed later: %+v", before)
	}
	select {
	case <-changed:
		t.Fatal("a working push was told as a change of state")
	default:
	}
	none, err := NewGroup(nil, src)
	if err != nil {
		t.Fatal(err)
	}
	if st := none.Status(); st != nil {
		t.Fatalf("a group of no upstream shows %+v", st)
	}
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
	start(t, Config{Upstream: mustUpstream(t, "http://"+ln.Addr().String()), Interval: time.Hour}, src)
	clk := newTestClock()
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, Clock: clk}, src)
	testutil.Eventually(t, "the first push to the good upstream", func() bool { return len(rcv.got()) >= 1 })
	// Each change comes after a quiet spell, so the good upstream gets each
	// at once while the other one's first push still hangs.
	for seq := uint64(2); seq <= 6; seq++ {
		clk.Advance(minGap)
		src.change()
		testutil.Eventually(t, fmt.Sprintf("the good upstream to get seq %d", seq), func() bool { g := rcv.got(); return g[len(g)-1] == seq })
	}
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
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, TokenFile: tok}, src)
	testutil.Eventually(t, "a push", func() bool { return len(rcv.got()) >= 1 })
	if err := os.WriteFile(tok, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The file's size changed with it, so the sender reads it again even
	// where the modification time has not moved.
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

	// A rotation to a token of the same length that keeps the file's
	// modification time (cp -p) is seen too. The change time ticks with the
	// kernel's clock (a jiffy, 10 ms at most).
	fi, err := os.Stat(tok)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(25 * time.Millisecond)
	if err := os.WriteFile(tok, []byte("third--token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(tok, fi.ModTime(), fi.ModTime())
	src.change()
	testutil.Eventually(t, "a push with the token of the same length", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return rcv.auth[len(rcv.auth)-1] == "Bearer third--token"
	})
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
	untrusted := start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour}, src)
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, CAFile: ca}, src)
	testutil.Eventually(t, "a push through the private CA", func() bool { return len(rcv.got()) >= 1 })
	testutil.Eventually(t, "the sender without the CA failing", func() bool { return untrusted.Status().Failures >= 1 })
	if _, err := New(Config{Upstream: mustUpstream(t, srv.URL), CAFile: filepath.Join(t.TempDir(), "none.pem")}, src); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

func TestParseUpstream(t *testing.T) {
	for good, full := range map[string]bool{"http://s:8080/v1/snapshots": false, "https://scheduler.example/x": true, "http://tok@s/x": true} {
		u, err := ParseUpstream(good)
		if err != nil {
			t.Errorf("%s: %v", good, err)
			continue
		}
		if u.url != good || u.String() != RedactURL(good) || u.fullDetail(false) != full || !u.fullDetail(true) {
			t.Errorf("%s parsed as %+v", good, u)
		}
	}
	for _, bad := range []string{"", "scheduler:8080", "ftp://s/x", "http://", "://x", "unix:///run/x.sock"} {
		if _, err := ParseUpstream(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseUpstream(f *testing.F) {
	for _, s := range []string{"http://s:8080/v1/snapshots", "https://x", "ftp://s", "", "http://[::1]:80/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { ParseUpstream(s) })
}

// mustUpstream is raw parsed, which must work.
func mustUpstream(t testing.TB, raw string) Upstream {
	t.Helper()
	u, err := ParseUpstream(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
