package collector

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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
//   - frag-flooded: frag, while another caller floods the collector with
//     placement requests (floodWorkers at once, each asking again as
//     soon as it is answered or refused): the placements measured are the
//     first caller's, and each client may have MaxPlacementsInFlight under
//     way. It also reports the flood's placements answered and refused a
//     second.
func BenchmarkPlacementsUnderIngest(b *testing.B) {
	b.Run("best-fit", func(b *testing.B) { placementsUnderIngest(b, placement.BestFit, []string{`{"units":4}`}, false) })
	fragBodies := []string{`{"units":1}`, `{"units":2}`, `{"units":4}`, `{"units":8}`, `{"gpus":1}`}
	b.Run("frag", func(b *testing.B) { placementsUnderIngest(b, placement.Frag, fragBodies, false) })
	b.Run("frag-flooded", func(b *testing.B) { placementsUnderIngest(b, placement.Frag, fragBodies, true) })
}

// floodWorkers is how many placement requests the flooding caller of
// BenchmarkPlacementsUnderIngest/frag-flooded sends at once.
const floodWorkers = 32

// placementsUnderIngest places bodies in turn under policy p, with another
// caller flooding the collector with placement requests when flood is set.
func placementsUnderIngest(b *testing.B, p placement.Policy, bodies []string, flood bool) {
	const nodes, gpus, rate = 10000, 8, 10000
	st := NewStore(time.Hour, nil)
	st.MaxNodes = nodes
	s := NewServer(st, nil)
	s.SetPolicy(p)
	s.Auth.LearnTokens = callerTokensFile(b, "scheduler t0k\nflood f100d\n")
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
	var answered, refused atomic.Int64
	var flooders sync.WaitGroup
	if flood {
		// The flood comes over TCP, each worker on a connection of its
		// own, as a client's would: it costs the collector what a
		// request costs, not what making one in the same process does.
		srv := httptest.NewServer(s)
		defer srv.Close()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: floodWorkers}}
		for w := range floodWorkers {
			flooders.Add(1)
			go func() {
				defer flooders.Done()
				for i := w; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest("POST", srv.URL+"/v1/placements", strings.NewReader(bodies[i%len(bodies)]))
					req.Header.Set("Authorization", "Bearer f100d")
					resp, err := client.Do(req)
					if err != nil {
						b.Errorf("flood: %v", err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						answered.Add(1)
					case 429:
						refused.Add(1)
					default:
						b.Errorf("flood: %s", resp.Status)
						return
					}
				}
			}()
		}
	}
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
	flooders.Wait()
	if flood {
		b.ReportMetric(float64(answered.Load())/elapsed.Seconds(), "flood-answered/s")
		b.ReportMetric(float64(refused.Load())/elapsed.Seconds(), "flood-refused/s")
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(applied.Load())/elapsed.Seconds(), "snapshots/s")
}
