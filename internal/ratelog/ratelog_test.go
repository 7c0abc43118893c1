package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBudgetCountsAndReportsLeftOut(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "junk", 3, clock.now)
	written := 0
	for i := 0; i < 10; i++ {
		if l.Log(slog.LevelWarn, "junk entry", "n", i) {
			written++
		}
	}
	if written != 3 {
		t.Fatalf("%d lines written in one second, want 3", written)
	}
	if got := strings.Count(buf.String(), "junk entry"); got != 3 {
		t.Fatalf("%d lines in the log, want 3:\n%s", got, buf.String())
	}
	l.Flush()
	if strings.Contains(buf.String(), "left out") {
		t.Fatalf("left-out line before the second ended:\n%s", buf.String())
	}
	clock.add(time.Second)
	l.Flush()
	if !strings.Contains(buf.String(), "left_out=7") || !strings.Contains(buf.String(), "what=junk") {
		t.Fatalf("no left-out count after the second:\n%s", buf.String())
	}
	buf.Reset()
	l.Flush()
	if buf.Len() != 0 {
		t.Fatalf("a second flush wrote again: %s", buf.String())
	}
	if !l.Log(slog.LevelInfo, "again") {
		t.Fatal("a new second has no budget")
	}
}

func TestConcurrentLinesStayWithinBudget(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	clock := &fakeClock{t: time.Unix(1000, 0)}
	h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), nil)
	l := New(slog.New(h), "x", 50, clock.now)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				l.Log(slog.LevelWarn, "line")
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Count(buf.String(), "msg=line"); got != 50 {
		t.Fatalf("%d lines, want 50", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The count of what a burst left out is written within about a second even
// when no line follows.
func TestLeftOutIsReportedWithoutAnotherLine(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), nil)
	l := New(slog.New(h), "burst", 1, nil)
	for range 5 {
		l.Log(slog.LevelWarn, "line")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := buf.String()
		mu.Unlock()
		if strings.Contains(got, "left_out=4") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no left-out line without another line:\n%s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
