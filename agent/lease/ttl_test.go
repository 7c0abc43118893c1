package lease

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestTTLLeasesExpireInDeadlineOrderUnderOneTimer: every ttl lease waits
// under one timer, set for the soonest deadline; leases end in deadline
// order, a renewal or a release moves the next end, and a clock stepped
// back ends nothing.
func TestTTLLeasesExpireInDeadlineOrderUnderOneTimer(t *testing.T) {
	f := newFixture(t, 1, 8, 1)
	c := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	ids := map[string]string{}
	for _, ttl := range []string{"3s", "1s", "2s", "5s", "4s", "6s"} {
		g, err := m.Acquire(context.Background(), root, ttlReq(1, ttl))
		if err != nil {
			t.Fatal(err)
		}
		ids[g.ID] = ttl
	}
	byTTL := func(ttl string) string {
		for id, d := range ids {
			if d == ttl {
				return id
			}
		}
		t.Fatalf("no lease of %s", ttl)
		return ""
	}
	if n := c.Pending(); n != 1 {
		t.Fatalf("%d timers for 6 ttl leases, want 1", n)
	}
	live := func() []string {
		var out []string
		for _, l := range m.View().Leases() {
			out = append(out, ids[l.ID])
		}
		slices.Sort(out)
		return out
	}
	wantLive := func(when string, want ...string) {
		t.Helper()
		testutil.Eventually(t, when, func() bool { return slices.Equal(live(), want) && c.Pending() == 1 })
	}
	if err := m.Release(root, byTTL("4s")); err != nil {
		t.Fatal(err)
	}
	c.Advance(500 * time.Millisecond)
	if _, err := m.Renew(root, byTTL("1s")); err != nil { // now until 1.5 s
		t.Fatal(err)
	}
	c.Advance(700 * time.Millisecond) // 1.2 s: the timer set for 1 s finds nothing due
	wantLive("nothing to end at 1.2 s", "1s", "2s", "3s", "5s", "6s")
	c.Advance(400 * time.Millisecond) // 1.6 s
	wantLive("the renewed lease to end at 1.5 s", "2s", "3s", "5s", "6s")
	c.Advance(1500 * time.Millisecond) // 3.1 s
	wantLive("the 2 s and 3 s leases to end", "5s", "6s")
	c.Set(c.Now().Add(-time.Minute)) // stepped back to -56.9 s
	wantLive("nothing to end on a clock stepped back", "5s", "6s")
	c.Set(c.Now().Add(time.Minute + 2*time.Second)) // 5.1 s
	wantLive("the 5 s lease to end", "6s")
	if err := m.Release(root, byTTL("6s")); err != nil {
		t.Fatal(err)
	}
	c.Advance(2 * time.Second)
	testutil.Eventually(t, "the timer to find the queue empty", func() bool { return c.Pending() == 0 })
	if len(m.View().Leases()) != 0 || f.fifoCount(t, 0) != 0 {
		t.Fatalf("leases %v, %d FIFOs left", live(), f.fifoCount(t, 0))
	}
}

// lateClock is a Fake whose timers never fire: a ttl timer that is late, or
// waits for the lock while a renewal holds it.
type lateClock struct{ *clock.Fake }

func (lateClock) AfterFunc(time.Duration, func()) clock.Timer { return lateTimer{} }

type lateTimer struct{}

func (lateTimer) Stop() bool { return true }

// TestRenewDoesNotReviveAnExpiredLease: a renewal that comes after the
// deadline, before the timer has ended the lease, ends it instead of
// extending it: a lease ends unless renewed within its ttl.
func TestRenewDoesNotReviveAnExpiredLease(t *testing.T) {
	f := newFixture(t, 1, 8, 1)
	c := lateClock{clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))}
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	g, err := m.Acquire(context.Background(), root, ttlReq(1, "1s"))
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(1500 * time.Millisecond)
	if l, err := m.Renew(root, g.ID); err == nil {
		t.Fatalf("renewed lease %s 0.5 s after its deadline, now until %v", l.ID, l.Expires)
	} else if !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("renewal of an expired lease: %v, want not_found", err)
	}
	if n := len(m.View().Leases()); n != 0 || f.fifoCount(t, 0) != 0 {
		t.Fatalf("%d leases and %d FIFOs left after the ttl ran out", n, f.fifoCount(t, 0))
	}
}
