package lease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestLeaseLinesStayWithinTheirBudget: past leaseLinesPerSecond, grant and
// end lines are counted, one line says how many were left out, and the
// counters still count every lease.
func TestLeaseLinesStayWithinTheirBudget(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	var logs testutil.SyncBuffer
	c := clock.NewFake(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.Clock = c
	})
	const n = 250
	for i := 0; i < n; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Release(root, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(msg string) int { return strings.Count(logs.String(), `msg="`+msg+`"`) }
	if got := lines("lease granted") + lines("lease ended"); got != leaseLinesPerSecond {
		t.Fatalf("%d lease lines within one second, want the budget of %d", got, leaseLinesPerSecond)
	}
	c.Advance(time.Second)
	m.Tick()
	want := fmt.Sprintf("left_out=%d", 2*n-leaseLinesPerSecond)
	if !strings.Contains(logs.String(), want) {
		t.Fatalf("no line saying %s:\n%s", want, logs.String())
	}
	if v := m.View(); v.Granted != n || v.Ended != n {
		t.Fatalf("counted %d granted, %d ended; want %d each", v.Granted, v.Ended, n)
	}
	// A new second has a new budget.
	l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), l.ID) {
		t.Fatal("the first grant of a new second was not logged")
	}
}

// Readers never take the lease table's lock: the view is there while the
// lock is held.
func TestViewIsReadWithoutTheLock(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	done := make(chan *View)
	go func() { done <- m.View() }()
	select {
	case v := <-done:
		if len(v.Leases()) != 1 {
			t.Fatalf("view has %d leases, want 1", len(v.Leases()))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("View waited for the lease table's lock")
	}
}

// Every change is told to OnChange, also one whose view a decision under the
// same lock published first: here a claim counted while a request waits,
// which the claim's batch tries to serve, and cannot.
func TestEveryChangeIsTold(t *testing.T) {
	f := newFixture(t, 2, 1, 1)
	var told atomic.Int64
	m := f.manager(t, func(c *Config) { c.OnChange = func() { told.Add(1) } })
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1h")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req := ttlReq(2, "1h")
		req.GPU = "0"
		req.Wait = time.Minute
		m.Acquire(ctx, root, req)
	}()
	testutil.Eventually(t, "the request to wait", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.waiters) == 1
	})
	before := told.Load()
	claimOffline(t, f, 0, 1)
	testutil.Eventually(t, "the claim in the view", func() bool { return m.View().GPUs[0].Offline == 1 })
	testutil.Eventually(t, "OnChange told of it", func() bool { return told.Load() > before })
}

// TestKeptLeaseLinesStayWithinTheirBudget: a restart that keeps more leases
// than the line budget says so in as many lines, and how many it left out.
func TestKeptLeaseLinesStayWithinTheirBudget(t *testing.T) {
	f := newFixture(t, 1, 64, 1) // 128 units
	c := clock.NewFake(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	const n = leaseLinesPerSecond + 20
	for range n {
		if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1h")); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	var logs testutil.SyncBuffer
	m = f.manager(t, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.Clock = c
	})
	if got := strings.Count(logs.String(), `msg="lease kept across daemon restart"`); got != leaseLinesPerSecond {
		t.Fatalf("%d lines of kept leases, want the budget of %d", got, leaseLinesPerSecond)
	}
	c.Advance(time.Second)
	m.Tick()
	if want := fmt.Sprintf("left_out=%d", n-leaseLinesPerSecond); !strings.Contains(logs.String(), want) {
		t.Fatalf("no line saying %s:\n%s", want, logs.String())
	}
	if got := m.View().LeaseCount(); got != n {
		t.Fatalf("%d leases kept, want %d", got, n)
	}
}
