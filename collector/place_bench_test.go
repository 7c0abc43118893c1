package collector

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPlacementsUnderIngest is POST /v1/placements (best-fit, 4 units)
// with 10,000 nodes of 8 GPUs in the table, while another goroutine applies
// 10,000 snapshots a second, each of one node with new free units. It
// reports the placements' p50 and p99 (goal: p99 ≤ 5 ms) and the snapshots
// applied a second meanwhile.
func BenchmarkPlacementsUnderIngest(b *testing.B) {
	const nodes, gpus, rate = 10000, 8, 10000
	st := NewStore(time.Hour, nil)
	st.MaxNodes = nodes
	s := NewServer(st, nil)
	for n := range nodes {
		st.Apply(withInstances(testSnapshot(fmt.Sprintf("node-%05d", n), "b", 1, n%9, gpus)))
	}
	stop := make(chan struct{})
	var applied atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		seq := uint64(2)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for range rate / 1000 {
				n := (i*7919 + int(seq)) % nodes
				st.Apply(withInstances(testSnapshot(fmt.Sprintf("node-%05d", n), "b", seq, int(seq)%9, gpus)))
				seq++
				applied.Add(1)
			}
		}
	}()
	lat := make([]time.Duration, 0, b.N)
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/placements", strings.NewReader(`{"units":4}`)))
		lat = append(lat, time.Since(t0))
		if rec.Code != 200 {
			b.Fatalf("placement: %d %s", rec.Code, rec.Body)
		}
	}
	b.StopTimer()
	elapsed := time.Since(start)
	close(stop)
	<-done
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(applied.Load())/elapsed.Seconds(), "snapshots/s")
}
