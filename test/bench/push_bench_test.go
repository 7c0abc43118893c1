package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// pushReceiver records when each pushed snapshot arrived and what it said.
type pushReceiver struct {
	mu      sync.Mutex
	arrived []time.Time
	used    []int
	wake    chan struct{}
}

func (r *pushReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var s api.Snapshot
	if json.NewDecoder(req.Body).Decode(&s) != nil {
		http.Error(w, "bad", 400)
		return
	}
	used := 0
	for _, g := range s.GPUs {
		used += g.UnitsUsed
	}
	r.mu.Lock()
	r.arrived = append(r.arrived, time.Now())
	r.used = append(r.used, used)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}

// waitUsed waits until a push that arrived after since shows used units in
// use, and returns when it arrived.
func (r *pushReceiver) waitUsed(b *testing.B, used int, since time.Time) time.Time {
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		for i := len(r.used) - 1; i >= 0 && r.arrived[i].After(since); i-- {
			if r.used[i] == used {
				at := r.arrived[i]
				r.mu.Unlock()
				return at
			}
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-deadline:
			b.Fatalf("no push showed %d units in use within 10s", used)
		}
	}
}

func (r *pushReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.arrived)
}

// BenchmarkPushLatency is the time from a lease's grant to a real receiver
// holding a snapshot that shows it, on a quiet node: each iteration leaves
// the node quiet for 150 ms, takes a lease, waits for its push, releases it
// and waits for that push, so ns/op is mostly the quiet spell; the figure is
// p50-ns and p99-ns. Goal: p99 ≤ 50 ms. Take enough iterations for a p99:
// -benchtime 200x.
func BenchmarkPushLatency(b *testing.B) {
	rcv := &pushReceiver{wake: make(chan struct{}, 1)}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	d := startDaemon(b, "--upstream", srv.URL, "--report-interval", "1h")
	rcv.waitUsed(b, 0, time.Time{})
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		time.Sleep(150 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"})
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, rcv.waitUsed(b, 1, start).Sub(start))
		err = d.Client.Release(ctx, l.ID)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		rcv.waitUsed(b, 0, start)
	}
	b.StopTimer()
	reportLatencies(b, "", lat)
}

// BenchmarkPushUnderChurn is lease+release at 8 clients as fast as gpuletd
// takes them, with an upstream: how many pushes a second the upstream gets.
// Goal: at most 10 a second, however many leases a second.
func BenchmarkPushUnderChurn(b *testing.B) {
	rcv := &pushReceiver{wake: make(chan struct{}, 1)}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	d := startDaemon(b, "--upstream", srv.URL, "--report-interval", "1h", "--clients-per-instance", "64", "--units-per-gpu", "64")
	rcv.waitUsed(b, 0, time.Time{})
	before := rcv.count()
	start := time.Now()
	run(b, d.Socket, 8, leaseRelease)
	elapsed := time.Since(start)
	pushes := rcv.count() - before
	b.ReportMetric(float64(pushes)/elapsed.Seconds(), "pushes/s")
}
