package lease

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/placement"
)

// The stream of BenchmarkWholeGPUWaiterUnderStream: one 1-unit lease arrives
// each fake second and lasts streamLease, on two GPUs of 4 units with one unit
// of GPU 1 taken all along, so 6 of the stream's 7 units are busy on average
// and, under best-fit (the default) as under spread, no GPU is ever whole:
// arrivals keep taking units of both GPUs (runStream fails if a waiter that is
// not held for is served).
const (
	streamLease  = 6 * time.Second
	streamWarmup = 30 * time.Second
	// wholeLease is how long the whole-GPU lease runs once granted.
	wholeLease = time.Minute
	// streamAfter is how long the stream runs after the waiter arrives:
	// past the hold's bound (waitHoldAfter+waitHoldFor), so that a waiter
	// not served by then never is, and long enough for the stream's backlog
	// to drain after the whole-GPU lease.
	streamAfter = 15 * time.Minute
)

// streamResult is what one run of the stream measured, in fake seconds.
type streamResult struct {
	served  bool
	waitedS float64 // the whole-GPU waiter's wait; streamAfter when never served
	// heldRefusals counts the ticks at which a stream lease was refused
	// because units were held; heldReqS sums, over those ticks, the stream
	// requests kept out (each for the tick's second); heldReqs counts the
	// distinct requests kept out at least once.
	heldRefusals, heldReqs int
	heldReqS               float64
	// delayS and maxDelayS are the stream's waits from arrival to grant, for
	// any reason (the whole-GPU lease's GPU is one), summed and the longest;
	// delayed counts the requests that waited at all.
	delayS, maxDelayS float64
	delayed           int
}

// BenchmarkWholeGPUWaiterUnderStream drives, on a fake clock, a steady stream
// of 1-unit leases with one whole-GPU request waiting, and reports how long
// the request waited and what the hold (fairness.go) cost the stream:
//
//   - held: the waiter's owner holds nothing, so once it has waited
//     waitHoldAfter freed units are held for it;
//   - not-held: the same stream, with the unit taken all along on GPU 1 the
//     waiter's owner's rather than another user's: a user who holds units is
//     never held for, and the hold has no switch, so this is the stream with
//     the hold off.
//
// Both under best-fit and under spread. Each iteration runs the whole stream
// on a new Manager; the figures are fake seconds, the same in every iteration
// (it fails if they are not), and ns/op is the real time of one run.
func BenchmarkWholeGPUWaiterUnderStream(b *testing.B) {
	for _, policy := range []placement.Policy{placement.BestFit, placement.Spread} {
		for _, held := range []bool{true, false} {
			name := string(policy) + "/held"
			if !held {
				name = string(policy) + "/not-held"
			}
			b.Run(name, func(b *testing.B) { streamBench(b, policy, held) })
		}
	}
}

// streamBench runs the stream b.N times and reports what it measured.
func streamBench(b *testing.B, policy placement.Policy, held bool) {
	var first streamResult
	for i := 0; i < b.N; i++ {
		r := runStream(b, policy, held)
		if i == 0 {
			first = r
		} else if r != first {
			b.Fatalf("run %d measured %+v, run 0 %+v: the stream is not deterministic", i, r, first)
		}
	}
	b.ReportMetric(first.waitedS, "waited-s")
	served := 0.0
	if first.served {
		served = 1
	}
	b.ReportMetric(served, "served")
	b.ReportMetric(float64(first.heldRefusals), "held-refusals")
	b.ReportMetric(float64(first.heldReqs), "held-requests")
	b.ReportMetric(first.heldReqS, "held-request-s")
	b.ReportMetric(float64(first.delayed), "delayed-requests")
	b.ReportMetric(first.delayS, "delay-s")
	b.ReportMetric(first.maxDelayS, "max-delay-s")
}

// runStream runs the stream once under policy; held says whether the
// waiter's owner holds nothing (held for) or the unit taken all along on GPU
// 1 (not held for).
func runStream(b *testing.B, policy placement.Policy, held bool) streamResult {
	b.Helper()
	c := clock.NewFake(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	m, ctx := benchManager(b, 4, func(cfg *Config) { cfg.Clock = c; cfg.Policy = policy })
	small, other, big := identity.Peer{UID: 2001, Admin: true}, identity.Peer{UID: 2003, Admin: true}, identity.Peer{UID: 2002, Admin: true}
	pinned := ttlReq(1, "24h")
	pinned.GPU = "1"
	keeper := other
	if !held {
		keeper = big
	}
	if _, err := m.Acquire(ctx, keeper, pinned); err != nil {
		b.Fatal(err)
	}
	type live struct {
		id  string
		end time.Time
	}
	var (
		r       streamResult
		running []live      // the stream's leases, in the order they end
		pending []time.Time // the stream's requests not yet granted, by arrival
		keptOut = map[time.Time]bool{}
	)
	tick := func() {
		c.Advance(time.Second)
		now := c.Now()
		for len(running) > 0 && !running[0].end.After(now) {
			if err := m.Release(small, running[0].id); err != nil {
				b.Fatal(err)
			}
			running = running[1:]
		}
		pending = append(pending, now)
		for len(pending) > 0 {
			l, err := m.Acquire(ctx, small, ttlReq(1, "1h"))
			if err != nil {
				if !errors.Is(err, api.ErrInsufficientUnits) {
					b.Fatal(err)
				}
				if strings.Contains(err.Error(), "held for a whole-GPU request") {
					r.heldRefusals++
					r.heldReqS += float64(len(pending))
					for _, at := range pending {
						keptOut[at] = true
					}
				}
				break
			}
			d := now.Sub(pending[0]).Seconds()
			if d > 0 {
				r.delayed++
			}
			r.delayS += d
			r.maxDelayS = max(r.maxDelayS, d)
			pending = pending[1:]
			running = append(running, live{l.ID, now.Add(streamLease)})
		}
	}
	for range int(streamWarmup / time.Second) {
		tick()
	}
	// Past the warm-up, no GPU is whole: the waiter waits.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan Grant, 1)
	go func() {
		g, err := m.Acquire(wctx, big, Request{LeaseRequest: api.LeaseRequest{GPUs: 1, TTL: "1h"}, TTL: time.Hour, Wait: time.Hour})
		if err == nil {
			done <- g
		}
	}()
	waiting := func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.waiters) == 1
	}
	for !waiting() {
		runtime.Gosched()
	}
	since := c.Now()
	r.waitedS = streamAfter.Seconds()
	var whole Grant
	for c.Now().Sub(since) < streamAfter {
		tick()
		if !r.served && !waiting() {
			r.served, r.waitedS = true, c.Now().Sub(since).Seconds()
			whole = <-done
		}
		if r.served && whole.ID != "" && c.Now().Sub(since).Seconds() >= r.waitedS+wholeLease.Seconds() {
			if err := m.Release(big, whole.ID); err != nil {
				b.Fatal(err)
			}
			whole.ID = ""
		}
	}
	// The bound design.md §6 gives: the threshold and the time the leases
	// on one GPU take to end. Without the hold the stream must starve the
	// waiter, or the contrast shows nothing.
	if bound := waitHoldAfter + streamLease; held && (!r.served || r.waitedS > bound.Seconds()) {
		b.Fatalf("held for, the waiter was served %v after %vs, beyond %s", r.served, r.waitedS, bound)
	} else if !held && r.served {
		b.Fatalf("not held for, the waiter was served after %vs: the stream left a GPU whole", r.waitedS)
	}
	if len(pending) > 0 {
		b.Fatalf("%d of the stream's requests still waiting after %s: the stream does not drain", len(pending), streamAfter)
	}
	r.heldReqs = len(keptOut)
	return r
}

// BenchmarkWholeGPUWaiterLeaseCost is the real cost of a 1-unit lease and its
// release on a Manager with no waiter (free) against one with a whole-GPU
// request waiting under waitHoldAfter (waiting: each grant asks whether units
// are held, each release tries the waiter), and of the refusal a 1-unit
// request meets while units are held (held-refused), in alternating turns.
// Every GPU has a unit taken all along, so the waiter is never served.
func BenchmarkWholeGPUWaiterLeaseCost(b *testing.B) {
	small, other, big := identity.Peer{UID: 2001, Admin: true}, identity.Peer{UID: 2003, Admin: true}, identity.Peer{UID: 2002, Admin: true}
	var sides [3]*Manager
	var ctx context.Context
	for k := range sides {
		c := clock.NewFake(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
		m, mctx := benchManager(b, 4, func(cfg *Config) { cfg.Clock = c })
		sides[k], ctx = m, mctx
		for _, g := range []string{"0", "1"} {
			r := ttlReq(1, "24h")
			r.GPU = g
			if _, err := m.Acquire(ctx, other, r); err != nil {
				b.Fatal(err)
			}
		}
		if k == 0 {
			continue
		}
		go m.Acquire(mctx, big, Request{LeaseRequest: api.LeaseRequest{GPUs: 1, TTL: "1h"}, TTL: time.Hour, Wait: time.Hour})
		for {
			m.mu.Lock()
			n := len(m.waiters)
			m.mu.Unlock()
			if n == 1 {
				break
			}
			runtime.Gosched()
		}
		if k == 2 {
			c.Advance(waitHoldAfter)
		}
	}
	req := ttlReq(1, "1h")
	ops := [3]func(*Manager){
		func(m *Manager) {
			l, err := m.Acquire(ctx, small, req)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Release(small, l.ID); err != nil {
				b.Fatal(err)
			}
		},
		nil,
		func(m *Manager) {
			if _, err := m.Acquire(ctx, small, req); err == nil || !strings.Contains(err.Error(), "held for a whole-GPU request") {
				b.Fatalf("a 1-unit request while units are held: %v", err)
			}
		},
	}
	ops[1] = ops[0]
	const turn = 50
	var elapsed [3]time.Duration
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; done, round = done+turn, round+1 {
		n := min(turn, b.N-done)
		for k := range 3 {
			side := (k + round) % 3
			start := time.Now()
			for range n {
				ops[side](sides[side])
			}
			elapsed[side] += time.Since(start)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(elapsed[0].Nanoseconds())/float64(b.N), "free-ns/op")
	b.ReportMetric(float64(elapsed[1].Nanoseconds())/float64(b.N), "waiting-ns/op")
	b.ReportMetric(float64(elapsed[2].Nanoseconds())/float64(b.N), "held-refused-ns/op")
	b.ReportMetric(float64(elapsed[1])/float64(elapsed[0]), "x-free")
}
