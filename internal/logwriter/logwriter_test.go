package logwriter

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// slowBuffer is a reader that takes its time, so that lines pile up.
type slowBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
}

func (s *slowBuffer) Write(p []byte) (int, error) {
	time.Sleep(100 * time.Microsecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.buf.Write(p)
}

// Lines from many goroutines all arrive, whole and in each writer's order,
// and Close returns only after the last one is out.
func TestEveryLineArrivesInOrder(t *testing.T) {
	out := &slowBuffer{}
	w := New(out)
	const writers, lines = 8, 500
	var wg sync.WaitGroup
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < lines; i++ {
				fmt.Fprintf(w, "g=%d i=%d\n", g, i)
			}
		}()
	}
	wg.Wait()
	w.Close()
	next := make([]int, writers)
	got := strings.Split(strings.TrimSuffix(out.buf.String(), "\n"), "\n")
	if len(got) != writers*lines {
		t.Fatalf("%d lines, want %d", len(got), writers*lines)
	}
	for _, l := range got {
		var g, i int
		if _, err := fmt.Sscanf(l, "g=%d i=%d", &g, &i); err != nil || i != next[g] {
			t.Fatalf("line %q out of order or torn (want i=%d): %v", l, next[g], err)
		}
		next[g]++
	}
	if out.writes >= writers*lines {
		t.Errorf("%d writes for %d lines: nothing was batched", out.writes, len(got))
	}
}

// After Close, writes go straight through.
func TestWriteAfterClose(t *testing.T) {
	var out bytes.Buffer
	w := New(&out)
	w.Write([]byte("a\n"))
	w.Close()
	w.Write([]byte("b\n"))
	if out.String() != "a\nb\n" {
		t.Fatalf("got %q", out.String())
	}
}

// A line written while Close is still writing out the queue comes after it.
func TestWriteDuringCloseKeepsOrder(t *testing.T) {
	release := make(chan struct{})
	out := &gatedBuffer{release: release}
	w := New(out)
	w.Write([]byte("a\n"))
	out.waitStarted(t)
	w.Write([]byte("b\n"))
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	for !isClosed(w) {
		time.Sleep(time.Millisecond)
	}
	wrote := make(chan struct{})
	go func() { w.Write([]byte("c\n")); close(wrote) }()
	close(release)
	<-closed
	<-wrote
	if got := out.String(); got != "a\nb\nc\n" {
		t.Fatalf("got %q, want a, b, c in order", got)
	}
}

// Flush returns only once what was written before it is out.
func TestFlushWaitsForEarlierLines(t *testing.T) {
	release := make(chan struct{})
	out := &gatedBuffer{release: release}
	w := New(out)
	defer w.Close()
	w.Write([]byte("x\n"))
	flushed := make(chan struct{})
	go func() { w.Flush(); close(flushed) }()
	testutil.Eventually(t, "Flush to wait or return", func() bool {
		return isDone(flushed) || testutil.Parked("sync.(*Cond).Wait", "logwriter.(*Writer).Flush")
	})
	if isDone(flushed) {
		t.Fatal("Flush returned while the line was still held up")
	}
	close(release)
	<-flushed
	if out.String() != "x\n" {
		t.Fatalf("after Flush: %q", out.String())
	}
}

// Through FlushingHandler a warning is out when the logging call returns.
func TestFlushingHandlerWritesWarningsAtOnce(t *testing.T) {
	out := &slowBuffer{}
	w := New(out)
	defer w.Close()
	log := slog.New(FlushingHandler(slog.NewTextHandler(w, nil), w, slog.LevelWarn)).With("daemon", "gpuletd")
	for i := 0; i < 20; i++ {
		log.Info("routine", "i", i)
	}
	log.Warn("something is wrong")
	out.mu.Lock()
	got := out.buf.String()
	out.mu.Unlock()
	if !strings.Contains(got, "something is wrong") || !strings.Contains(got, "i=19") {
		t.Fatalf("the warning and the lines before it were not out when Warn returned:\n%s", got)
	}
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func isClosed(w *Writer) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// gatedBuffer holds its first write until release is closed.
type gatedBuffer struct {
	release chan struct{}
	started atomic.Bool
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (g *gatedBuffer) Write(p []byte) (int, error) {
	g.started.Store(true)
	<-g.release
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

func (g *gatedBuffer) waitStarted(t *testing.T) {
	t.Helper()
	for !g.started.Load() {
		time.Sleep(time.Millisecond)
	}
}

func (g *gatedBuffer) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.String()
}

// A stalled reader makes writers wait once maxPending bytes are queued,
// rather than queueing without bound.
func TestStalledReaderBoundsTheQueue(t *testing.T) {
	release := make(chan struct{})
	out := &blockingWriter{release: release}
	w := New(out)
	line := bytes.Repeat([]byte("x"), 1024)
	wrote := make(chan int, 1)
	go func() {
		n := 0
		for i := 0; i < 4*maxPending/len(line); i++ {
			w.Write(line)
			n++
		}
		wrote <- n
	}()
	testutil.Eventually(t, "the writer to block or finish", func() bool {
		return len(wrote) > 0 || testutil.Parked("sync.(*Cond).Wait", "logwriter.(*Writer).Write")
	})
	select {
	case n := <-wrote:
		t.Fatalf("all %d writes returned while the reader was stalled", n)
	default:
	}
	w.mu.Lock()
	queued := len(w.pending)
	w.mu.Unlock()
	if queued > maxPending+len(line) {
		t.Fatalf("%d bytes queued, bound is %d", queued, maxPending)
	}
	close(release)
	<-wrote
	w.Close()
	if out.n != 4*maxPending {
		t.Fatalf("reader got %d bytes, want %d", out.n, 4*maxPending)
	}
}

type blockingWriter struct {
	release chan struct{}
	n       int
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	b.n += len(p)
	return len(p), nil
}
