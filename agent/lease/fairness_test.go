package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestWholeGPUWaiterGetsItsGPUUnderAStream: under a steady stream of 1-unit
// leases that begin and end so that no GPU is ever whole, a whole-GPU waiter
// was passed over for good. Once it has waited waitHoldAfter, freed units are
// held for it: the stream's next lease is refused, and the waiter gets the
// first GPU whose leases end.
func TestWholeGPUWaiterGetsItsGPUUnderAStream(t *testing.T) {
	f := newFixture(t, 1, 4, 1) // 2 GPUs of 4 units
	c := clock.NewFake(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	small, big := identity.Peer{UID: 2001, Admin: true}, identity.Peer{UID: 2002, Admin: true}
	var live [2][]string // the stream's leases per GPU, oldest first
	take := func(g int) error {
		r := ttlReq(1, "1h")
		r.GPU = strconv.Itoa(g)
		l, err := m.Acquire(context.Background(), small, r)
		if err == nil {
			live[g] = append(live[g], l.ID)
		}
		return err
	}
	end := func(g int) {
		if err := m.Release(small, live[g][0]); err != nil {
			t.Fatal(err)
		}
		live[g] = live[g][1:]
	}
	for g := range 2 {
		if err := take(g); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		g   Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := m.Acquire(context.Background(), big, Request{LeaseRequest: api.LeaseRequest{GPUs: 1, TTL: "1h"}, TTL: time.Hour, Wait: time.Hour})
		done <- result{g, err}
	}()
	testutil.Eventually(t, "the whole-GPU request waiting", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.waiters) == 1
	})
	// Each step a lease begins on a GPU before the oldest there ends.
	step := func(g int) error {
		if err := take(g); err != nil {
			return err
		}
		end(g)
		return nil
	}
	for i := range 20 {
		c.Advance(time.Second)
		if err := step(i % 2); err != nil {
			t.Fatalf("step %d, before the hold: %v", i, err)
		}
		select {
		case r := <-done:
			t.Fatalf("the waiter was served while no GPU was whole: %+v %v", r.g.Lease, r.err)
		default:
		}
	}
	c.Advance(waitHoldAfter)
	err := take(0)
	if !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "held for a whole-GPU request") {
		t.Fatalf("the stream's lease past the threshold: %v", err)
	}
	end(0)
	r := <-done
	if r.err != nil || len(r.g.GPUs) != 1 || r.g.GPUs[0].Index != 0 {
		t.Fatalf("the waiter: %+v %v, want GPU 0", r.g.Lease, r.err)
	}
	// Served, it holds nothing up.
	if err := take(1); err != nil {
		t.Fatalf("the stream after the waiter was served: %v", err)
	}
}

// TestHoldIsBounded: freed units are not held for a waiter whose owner holds
// units (their own leases may be what keeps a GPU from being whole), and a
// hold ends after waitHoldFor, whatever keeps the waiter out.
func TestHoldIsBounded(t *testing.T) {
	f := newFixture(t, 1, 4, 1) // 2 GPUs of 4 units
	c := clock.NewFake(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	small, big := identity.Peer{UID: 2001, Admin: true}, identity.Peer{UID: 2002, Admin: true}
	lease := func(p identity.Peer, g int) error {
		r := ttlReq(1, "1h")
		r.GPU = strconv.Itoa(g)
		_, err := m.Acquire(context.Background(), p, r)
		return err
	}
	for g := range 2 {
		if err := lease(small, g); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(p identity.Peer) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go m.Acquire(ctx, p, Request{LeaseRequest: api.LeaseRequest{GPUs: 1, TTL: "1h"}, TTL: time.Hour, Wait: time.Hour})
		testutil.Eventually(t, "the whole-GPU request waiting", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, w := range m.waiters {
				if w.peer.UID == p.UID {
					return true
				}
			}
			return false
		})
	}
	// big holds a unit of its own: its wait holds nothing up.
	if err := lease(big, 0); err != nil {
		t.Fatal(err)
	}
	wait(big)
	c.Advance(waitHoldAfter + time.Second)
	if err := lease(small, 1); err != nil {
		t.Fatalf("held for a waiter who holds units: %v", err)
	}
	// A third user who holds nothing: held for it, but only for waitHoldFor.
	wait(identity.Peer{UID: 2003, Admin: true})
	c.Advance(waitHoldAfter + time.Second)
	if err := lease(small, 1); err == nil {
		t.Fatal("not held for the waiter who holds nothing")
	}
	c.Advance(waitHoldFor)
	if err := lease(small, 1); err != nil {
		t.Fatalf("still held after waitHoldFor: %v", err)
	}
}

// TestHoldsOfOneUserAreSpaced: one user's requests queued one after another
// hold the node for at most waitHoldFor in every waitHoldEvery.
func TestHoldsOfOneUserAreSpaced(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	c := clock.NewFake(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	small, big := identity.Peer{UID: 2001, Admin: true}, identity.Peer{UID: 2002, Admin: true}
	lease := func(g int) error {
		r := ttlReq(1, "24h")
		r.GPU = strconv.Itoa(g)
		_, err := m.Acquire(context.Background(), small, r)
		return err
	}
	for g := range 2 {
		if err := lease(g); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func(n int) func() bool {
		return func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.waiters) == n
		}
	}
	// Each request gives up and the next is queued, one at a time.
	prev := func() {}
	wait := func() {
		t.Helper()
		prev()
		testutil.Eventually(t, "the last request gone", waiting(0))
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go m.Acquire(ctx, big, Request{LeaseRequest: api.LeaseRequest{GPUs: 1, TTL: "1h"}, TTL: time.Hour, Wait: 2 * time.Hour})
		prev = cancel
		testutil.Eventually(t, "the whole-GPU request waiting", waiting(1))
	}
	wait()
	c.Advance(waitHoldAfter)
	if err := lease(0); err == nil {
		t.Fatal("not held for the first request")
	}
	c.Advance(waitHoldFor)
	wait()
	c.Advance(waitHoldAfter)
	if err := lease(0); err != nil {
		t.Fatalf("held for the user's second request within waitHoldEvery: %v", err)
	}
	c.Advance(waitHoldEvery)
	wait()
	c.Advance(waitHoldAfter)
	if err := lease(1); err == nil {
		t.Fatal("not held for a request after waitHoldEvery")
	}
}
