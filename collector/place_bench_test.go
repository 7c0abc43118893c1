package collector

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/placement"
)

// BenchmarkPlacementsUnderIngest is POST /v1/placements with 10,000 nodes
// of 8 GPUs in the table, while another goroutine applies 10,000 snapshots a
// second, each of one node with new free units. It reports the placements'
// p50 and p99 (goal: p99 ≤ 5 ms) and the snapshots applied a second
// meanwhile.
//
//   - best-fit: every request asks for 4 units.
//   - frag: requests of 1, 2, 4 and 8 units and of a whole GPU in turn, so
//     that the collector learns a mix of five shapes (asked by a caller
//     of --learn-tokens-file) and puts a new one in
//     force every 1,024 requests, each dropping every node's kept answers
//     (run it for several thousand requests: -benchtime 5000x).
func BenchmarkPlacementsUnderIngest(b *testing.B) {
	b.Run("best-fit", func(b *testing.B) { placementsUnderIngest(b, placement.BestFit, []string{`{"units":4}`}) })
	b.Run("frag", func(b *testing.B) {
		placementsUnderIngest(b, placement.Frag, []string{`{"units":1}`, `{"units":2}`, `{"units":4}`, `{"units":8}`, `{"gpus":1}`})
	})
}

// placementsUnderIngest places bodies in turn under policy p.
func placementsUnderIngest(b *testing.B, p placement.Policy, bodies []string) {
	const nodes, gpus, rate = 10000, 8, 10000
	st := NewStore(time.Hour, nil)
	st.MaxNodes = nodes
	s := NewServer(st, nil)
	s.SetPolicy(p)
	s.Auth.LearnTokens = callerTokensFile(b, "scheduler t0k\n")
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
	for i := range b.N {
		t0 := time.Now()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/placements", strings.NewReader(bodies[i%len(bodies)]))
		req.Header.Set("Authorization", "Bearer t0k")
		s.ServeHTTP(rec, req)
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
