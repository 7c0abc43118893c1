package collector

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// slowPush is a push whose body arrives only when the test writes it, as
// from a slow sender.
type slowPush struct {
	body   *io.PipeWriter
	answer chan *httptest.ResponseRecorder
	// started: the server has begun to read the body.
	started atomic.Bool
}

// startSlowPush POSTs a snapshot to s whose body is sent by the test, in a
// request of ctx; reading counts it once the server reads the body.
func startSlowPush(s *Server, ctx context.Context, reading *atomic.Int32) *slowPush {
	r, w := io.Pipe()
	p := &slowPush{body: w, answer: make(chan *httptest.ResponseRecorder, 1)}
	req := httptest.NewRequestWithContext(ctx, "POST", "/v1/snapshots", readerFunc(func(b []byte) (int, error) {
		if !p.started.Swap(true) {
			reading.Add(1)
		}
		return r.Read(b)
	}))
	go func() {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		r.Close()
		p.answer <- rec
	}()
	return p
}

// finish sends the body of a snapshot of node and returns the answer.
func (p *slowPush) finish(t *testing.T, node string) *httptest.ResponseRecorder {
	t.Helper()
	b := body(t, testSnapshot(node, "b", 1, 4, 1), nil)
	go func() {
		p.body.Write(b)
		p.body.Close()
	}()
	return p.wait(t)
}

// wait returns the push's answer, which comes without its body when the
// push is refused.
func (p *slowPush) wait(t *testing.T) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case rec := <-p.answer:
		return rec
	case <-time.After(10 * time.Second):
		t.Fatal("no answer in 10s: the push waits for its body")
		return nil
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }

// However many senders push at once, however slowly, no more bodies are read
// at once than --max-pushes-in-flight: the others get 503 with Retry-After,
// unread, without waiting for their bodies; the slots come free again.
func TestPushesInFlightAreBounded(t *testing.T) {
	const slots, pushes = 2, 6
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.SetMaxPushesInFlight(slots)
	s.pushWait = 10 * time.Millisecond
	var reading atomic.Int32
	var held []*slowPush
	for range slots {
		held = append(held, startSlowPush(s, t.Context(), &reading))
	}
	testutil.Eventually(t, "the first pushes' bodies being read", func() bool { return reading.Load() == slots })
	for range pushes - slots {
		// The test never sends these bodies: an answer proves none was
		// waited for.
		rec := startSlowPush(s, t.Context(), &reading).wait(t)
		if msg := errorMessage(t, rec.Body.Bytes()); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" ||
			!strings.HasPrefix(msg, "unavailable: ") || !strings.Contains(msg, "--max-pushes-in-flight 2") {
			t.Fatalf("a push past the slots: %d, Retry-After %q, %s; want 503 unavailable with Retry-After 1 naming the flag",
				rec.Code, rec.Header().Get("Retry-After"), msg)
		}
	}
	if n := reading.Load(); n != slots {
		t.Fatalf("%d bodies read at once, want at most %d", n, slots)
	}
	if n := s.busy.Load(); n != pushes-slots {
		t.Fatalf("busy counted %d, want %d", n, pushes-slots)
	}
	for i, p := range held {
		if rec := p.finish(t, "n"+string(rune('0'+i))); rec.Code != http.StatusNoContent {
			t.Fatalf("a slow push once its body came: %d %s", rec.Code, rec.Body)
		}
	}
	if code, b := do(t, s, "POST", "/v1/snapshots", body(t, testSnapshot("n9", "b", 1, 4, 1), nil)); code != http.StatusNoContent {
		t.Fatalf("a push once the slots came free: %d %s", code, b)
	}
}

// A push past the slots waits for one to come free, but no longer than its
// request lasts.
func TestPushWaitsForASlot(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.SetMaxPushesInFlight(1)
	s.pushWait = time.Hour
	var reading atomic.Int32
	first := startSlowPush(s, t.Context(), &reading)
	testutil.Eventually(t, "the first push's body being read", func() bool { return reading.Load() == 1 })

	gone, leave := context.WithCancel(t.Context())
	abandoned := startSlowPush(s, gone, &reading)
	testutil.Eventually(t, "a push waiting for a slot", func() bool { return testutil.Parked("collector.(*Server).takePushSlot") })
	leave()
	if rec := abandoned.wait(t); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("a push whose request ended while it waited: %d, want 503", rec.Code)
	}

	waiting := startSlowPush(s, t.Context(), &reading)
	testutil.Eventually(t, "a push waiting for a slot", func() bool { return testutil.Parked("collector.(*Server).takePushSlot") })
	if rec := first.finish(t, "n1"); rec.Code != http.StatusNoContent {
		t.Fatalf("first push: %d %s", rec.Code, rec.Body)
	}
	if rec := waiting.finish(t, "n2"); rec.Code != http.StatusNoContent {
		t.Fatalf("a push that waited for the slot: %d %s", rec.Code, rec.Body)
	}
}

// The port closes at once a connection past --max-conns, logging why, and
// keeps those within it.
func TestListenClosesPastMaxConns(t *testing.T) {
	logBuf := &testutil.SyncBuffer{}
	ln, err := listen(Config{Listen: "127.0.0.1:0", MaxConns: 2}, slog.New(slog.NewTextHandler(logBuf, nil)))
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	srv := HTTPServer(NewServer(NewStore(time.Minute, nil), nil))
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	for range 2 {
		rc, err := testutil.DialRaw("tcp", addr, "collector")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Close() })
		if status, b, err := rc.Do("GET", "/v1/nodes", nil); err != nil || status != http.StatusOK {
			t.Fatalf("a connection within --max-conns: %d %s %v", status, b, err)
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Closed by the server, the read ends at once; kept, it would wait
	// for a request until the deadline.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a third connection past --max-conns 2: read %v, want EOF", err)
	}
	testutil.Eventually(t, "the refusal logged", func() bool { return strings.Contains(logBuf.String(), "--max-conns") })
}

// A push that took a slot and sends its body too slowly loses the slot when
// its body's time is up, long before the server's read timeout: a sender
// cannot keep a slot by dribbling.
func TestSlowBodyLosesItsSlot(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.SetMaxPushesInFlight(1)
	s.pushBodyTime = 100 * time.Millisecond
	srv := httptest.NewServer(HTTPServer(s).Handler)
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The headers and a part of a body that never ends.
	if _, err := io.WriteString(c, "POST /v1/snapshots HTTP/1.1\r\nHost: c\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"node\":"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := io.ReadAll(c)
	if !strings.HasPrefix(string(answer), "HTTP/1.1 400 ") {
		t.Fatalf("a body that stalls: %q %v, want 400 once its time is up", answer, err)
	}
	if code, b := do(t, s, "POST", "/v1/snapshots", body(t, testSnapshot("n1", "b", 1, 4, 1), nil)); code != http.StatusNoContent {
		t.Fatalf("a push after the stalled one lost its slot: %d %s", code, b)
	}
}
