package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/placement"
)

// BenchmarkPlace10000Nodes places requests on 10,000 nodes (as many 8-GPU
// as 2-GPU nodes, 1000 units per GPU) filled to about 70% of their GPU
// with requests of the shapes of a production trace, then reports each
// placement's time: p50 and p99 (ns). Each placement is committed, so the
// answers kept for the node it went to are asked again, as when a node's
// snapshot arrives.
func BenchmarkPlace10000Nodes(b *testing.B) {
	for _, p := range []placement.Policy{placement.BestFit, placement.Frag} {
		// Filled once: b.Run calls its function again for each b.N it
		// tries, and the placements it times go on filling the cluster.
		c := filledCluster(b, p, 10000, 0.7)
		b.Run(string(p), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 4))
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := traceRequest(rng)
				t0 := time.Now()
				a, err := c.Place(r, 1)
				times = append(times, time.Since(t0))
				if err == nil {
					_ = c.Commit(r, a.Ranked[0])
				}
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(times[min(len(times)*99/100, len(times)-1)].Nanoseconds()), "p99-ns")
		})
	}
}

// traceRequest draws a request of the shapes common in Alibaba's openb
// trace: a fraction of one GPU, one GPU, a few whole GPUs, or none.
func traceRequest(rng *rand.Rand) Request {
	fractions := []int{1000, 810, 470, 320, 650, 230, 460, 590, 160}
	r := Request{Request: placement.Request{HostCPUMilli: uint64(2000 * (1 + rng.IntN(6))), HostMemoryMiB: uint64(4096 * (1 + rng.IntN(8)))}}
	switch x := rng.IntN(100); {
	case x < 13:
	case x < 15:
		r.GPUs = []int{2, 4, 8}[rng.IntN(3)]
	default:
		r.Units = fractions[rng.IntN(len(fractions))]
	}
	return r
}

// filledCluster is n nodes, each filled with trace requests until fill of
// its GPU is taken (each node by its own engine, so that filling costs what
// the nodes hold, not nodes × requests), deciding under policy p, frag with
// the mix of the requests that filled them.
func filledCluster(tb testing.TB, p placement.Policy, n int, fill float64) *Cluster {
	tb.Helper()
	learner := placement.NewLearner(4096, 16, 1024)
	e := placement.New(p)
	c := New(e)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i++ {
		s := NodeSpec{Name: fmt.Sprintf("node-%05d", i), Units: 1000, CPUMilli: 96000, MemoryMiB: 393216}
		gpus, model := 8, "G2"
		if i%2 == 1 {
			gpus, model, s.CPUMilli = 2, "T4", 104000
		}
		for g := 0; g < gpus; g++ {
			s.GPUs = append(s.GPUs, GPUSpec{Name: model})
		}
		if err := c.Add(s); err != nil {
			tb.Fatal(err)
		}
		nd := c.nodes[i]
		for misses := 0; float64(nd.sum.free) > (1-fill)*float64(gpus*1000) && misses < 20; {
			r := traceRequest(rng)
			learner.Observe(r.Request)
			d, err := e.Place(nd.model, r.Request)
			if err != nil {
				misses++
				continue
			}
			commit(nd.model, r.Request, d.Choice)
			nd.summarize()
		}
	}
	if p == placement.Frag {
		c.SetEngine(e.WithMix(learner.Mix()))
	}
	return c
}

// BenchmarkMixSwitch is what a new mix costs the collector's placements: on
// 10,000 nodes of 8 GPUs of 8 units, as the collector models them (no
// host), a new mix of five shapes is put in force, then one request of each
// shape is placed. The first placement of each shape reads every node's row
// for it again. It reports the time from the new mix to the last of the
// five placements (switch-ns), and a placement of each shape once the rows
// are read (after-ns).
func BenchmarkMixSwitch(b *testing.B) {
	c := New(placement.New(placement.Frag))
	for i := range 10000 {
		s := NodeSpec{Name: fmt.Sprintf("node-%05d", i), Units: 8}
		for range 8 {
			s.GPUs = append(s.GPUs, GPUSpec{Name: "A100"})
		}
		m, err := newNode(s)
		if err != nil {
			b.Fatal(err)
		}
		m.Host = nil
		free := i % 9
		for g := range m.GPUs {
			m.GPUs[g].Free = max(free-g, 0)
			m.GPUs[g].Instances[0].FreeUnits = m.GPUs[g].Instances[0].FreeUnits[8-m.GPUs[g].Free:]
		}
		c.Put(s.Name, m)
	}
	shapes := []Request{{Request: placement.Request{Units: 1}}, {Request: placement.Request{Units: 2}}, {Request: placement.Request{Units: 4}},
		{Request: placement.Request{Units: 8}}, {Request: placement.Request{GPUs: 1}}}
	var switches, after time.Duration
	b.ResetTimer()
	for i := range b.N {
		mix := &placement.Mix{}
		for k := range shapes {
			mix.Shapes = append(mix.Shapes, placement.ShapeOf(shapes[k].Request))
			mix.Shapes[k].Weight = float64(1+(i+k)%5) / 15
		}
		t0 := time.Now()
		c.SetEngine(placement.New(placement.Frag).WithMix(mix))
		for _, r := range shapes {
			if _, err := c.Place(r, 1); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for _, r := range shapes {
			if _, err := c.Place(r, 1); err != nil {
				b.Fatal(err)
			}
		}
		switches += t1.Sub(t0)
		after += time.Since(t1)
	}
	b.ReportMetric(float64(switches.Nanoseconds())/float64(b.N), "switch-ns")
	b.ReportMetric(float64(after.Nanoseconds())/float64(b.N*len(shapes)), "after-ns")
}
