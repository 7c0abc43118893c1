package collector

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

const (
	benchNodes   = 10000
	benchGPUs    = 8
	benchSenders = 8
	benchQuery   = "/v1/table?type=A100&min_free=4&order=most_free&limit=20"
	// seqMark stands for the seq in a pre-encoded body; each POST puts the
	// real seq in its place.
	seqMark = 987654321987654321
)

// benchBody is a node's snapshot encoded around its seq.
type benchBody struct{ pre, post []byte }

var (
	benchBodiesOnce sync.Once
	benchBodies     []benchBody
)

// syntheticSnapshot is a node of 8 GPUs of three models, about 3 KB encoded.
func syntheticSnapshot(n int) *api.Snapshot {
	models := []string{"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla T4"}
	s := &api.Snapshot{
		Schema: api.SnapshotSchema, Node: fmt.Sprintf("node-%05d", n), BootID: fmt.Sprintf("%032x", n*7919),
		Seq: seqMark, Time: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), State: api.NodeWorking,
		Backend: api.BackendNVML, MPS: "on",
	}
	for i := 0; i < benchGPUs; i++ {
		free := (n*31 + i*7) % 17
		s.GPUs = append(s.GPUs, api.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", n, i, n%65536, i*3, n*benchGPUs+i),
			Name: models[(n+i)%len(models)], State: api.GPUWorking, Eligible: free > 0,
			UnitsTotal: 16, UnitsUsed: 16 - free, UnitsFree: free, UtilizationPct: (n + i) % 100, MaxUtilizationPct: 90,
			MemoryTotalMiB: 81920, MemoryUsedMiB: uint64((n*13 + i) % 81920),
			Instances:  []api.Instance{{Instance: 0, State: api.InstanceRunning, Clients: 16 - free, ClientsMax: 16, Units: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}},
			Capability: api.Capability{ComputeCapability: "8.0", Cores: 6912, MaxSMClockMHz: 1410, MemoryBusWidthBit: 5120, MemoryClockMHz: 1593},
		})
		s.UnitsTotal += 16
		s.UnitsFree += free
	}
	return s
}

func encodedBodies(b *testing.B) []benchBody {
	benchBodiesOnce.Do(func() {
		mark := []byte(strconv.FormatUint(seqMark, 10))
		for n := 0; n < benchNodes; n++ {
			raw := body(b, syntheticSnapshot(n), nil)
			i := bytes.Index(raw, mark)
			benchBodies = append(benchBodies, benchBody{raw[:i], raw[i+len(mark):]})
		}
	})
	return benchBodies
}

// ingest POSTs count snapshots (node k%benchNodes, seq firstSeq+k/benchNodes)
// to POST /v1/snapshots at addr from benchSenders raw keep-alive connections
// (testutil.RawConn: net/http's client cost a quarter of the machine's two
// CPUs, where real senders are other machines) and returns how long it took.
func ingest(b *testing.B, addr string, bodies []benchBody, count int, firstSeq uint64) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, benchSenders)
	start := time.Now()
	for w := 0; w < benchSenders; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc, err := testutil.DialRaw("tcp", addr, "collector")
			if err != nil {
				errs <- err
				return
			}
			defer rc.Close()
			var buf []byte
			for {
				k := int(next.Add(1) - 1)
				if k >= count {
					return
				}
				bb := bodies[k%benchNodes]
				buf = append(strconv.AppendUint(append(buf[:0], bb.pre...), firstSeq+uint64(k/benchNodes), 10), bb.post...)
				status, _, err := rc.Do(http.MethodPost, "/v1/snapshots", buf)
				if err != nil {
					errs <- err
					return
				}
				if status != http.StatusNoContent {
					errs <- fmt.Errorf("POST: status %d", status)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return elapsed
}

// serve serves h on a loopback TCP port and returns its address.
func serve(b *testing.B, h http.Handler) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := HTTPServer(h)
	go srv.Serve(ln)
	return ln.Addr().String(), func() { srv.Close() }
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkCollectorIngest: b.N snapshots of 10,000 nodes of 8 GPUs, POSTed
// over loopback HTTP to the collector's handler, against a floor of a bare
// server that reads and discards the same bodies; meanwhile a scheduler's
// filtered table query, timed for its p99; and the heap the table takes per
// 1,000 nodes.
func BenchmarkCollectorIngest(b *testing.B) {
	bodies := encodedBodies(b)
	size := 0
	for _, bb := range bodies {
		size += len(bb.pre) + len(bb.post) + 1
	}
	before := heapAlloc()
	store := NewStore(DefaultStaleAfter, nil)
	srv := NewServer(store, nil)
	addr, stop := serve(b, srv)
	defer stop()
	// Every node once (seq 1), so that the table is full when timing starts.
	ingest(b, addr, bodies, benchNodes, 1)

	queryStop := make(chan struct{})
	var lat []time.Duration
	var queryWG sync.WaitGroup
	queryWG.Add(1)
	go func() {
		defer queryWG.Done()
		qc := &http.Client{Transport: &http.Transport{}}
		for {
			select {
			case <-queryStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			t0 := time.Now()
			resp, err := qc.Get("http://" + addr + benchQuery)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
		}
	}()
	b.ResetTimer()
	elapsed := ingest(b, addr, bodies, b.N, 2)
	b.StopTimer()
	close(queryStop)
	queryWG.Wait()
	after := heapAlloc()
	runtime.KeepAlive(store)

	floorAddr, floorStop := serve(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer floorStop()
	floorElapsed := ingest(b, floorAddr, bodies, b.N, 2)

	rate := float64(b.N) / elapsed.Seconds()
	floor := float64(b.N) / floorElapsed.Seconds()
	b.ReportMetric(rate, "snapshots/s")
	b.ReportMetric(floor, "floor-snapshots/s")
	b.ReportMetric(rate/floor, "x-floor")
	b.ReportMetric(float64(size)/benchNodes, "body-bytes")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "query-p99-ms")
		b.ReportMetric(float64(len(lat)), "queries")
	}
	if after > before {
		b.ReportMetric(float64(after-before)/(benchNodes/1000)/(1<<20), "heap-MiB/1k-nodes")
	}
	b.ReportMetric(float64(srv.dropped.Load()), "dropped")
}

// BenchmarkDecodeSnapshot is the decoding of one node's snapshot as ingest
// receives it: most of what the collector spends on a snapshot.
func BenchmarkDecodeSnapshot(b *testing.B) {
	raw := body(b, syntheticSnapshot(7), nil)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeSnapshot(raw); err != nil {
			b.Fatal(err)
		}
	}
}
