package logwriter

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
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

// A stalled reader makes writers wait once maxPending bytes are queued,
// rather than queueing without bound.
func TestStalledReaderBoundsTheQueue(t *testing.T) {
	release := make(chan struct{})
	out := &blockingWriter{release: release}
	w := New(out)
	line := bytes.Repeat([]byte("x"), 1024)
	wrote := make(chan int)
	go func() {
		n := 0
		for i := 0; i < 4*maxPending/len(line); i++ {
			w.Write(line)
			n++
		}
		wrote <- n
	}()
	select {
	case n := <-wrote:
		t.Fatalf("all %d writes returned while the reader was stalled", n)
	case <-time.After(200 * time.Millisecond):
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
