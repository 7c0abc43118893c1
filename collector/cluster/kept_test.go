package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpulet/gpulet/placement"
)

// TestKeptAnswersAreTheEngines: under the frag policy, with hosts whose CPU
// and memory run short and a mix whose shapes need them, the answers a
// cluster keeps per node (keyed by the engine's HostPart, not the request's
// own CPU and memory) and the engine's memo rank the nodes exactly as asking
// every node's engine afresh does, request after request.
func TestKeptAnswersAreTheEngines(t *testing.T) {
	mix := &placement.Mix{Shapes: []placement.Shape{
		{Units: 30, HostCPUMilli: 4000, Weight: 0.3},
		{Units: 60, HostCPUMilli: 16000, HostMemoryMiB: 32768, Weight: 0.3},
		{GPUs: 1, HostCPUMilli: 8000, Weight: 0.2},
		{HostCPUMilli: 2000, Weight: 0.2},
	}}
	rng := rand.New(rand.NewPCG(7, 8))
	var specs []NodeSpec
	for i := 0; i < 30; i++ {
		specs = append(specs, spec(fmt.Sprintf("n%02d", i), "T4", 1+rng.IntN(4), uint64(8000+rng.IntN(4)*8000)))
	}
	c := newCluster(t, placement.Frag, specs...)
	c.SetEngine(placement.New(placement.Frag).WithMix(mix))
	for i := 0; i < 400; i++ {
		r := Request{Request: placement.Request{Units: 1 + rng.IntN(100), HostCPUMilli: uint64(rng.IntN(5) * 1000), HostMemoryMiB: uint64(rng.IntN(3) * 4096)}}
		switch rng.IntN(8) {
		case 0:
			r.Units, r.GPUs = 0, 1
		case 1:
			r.Units = 0
		}
		got, err := c.Place(r, 3)
		var want []Verdict
		for idx, n := range c.nodes {
			if !n.sum.mayFit(&r) {
				continue
			}
			d, err := c.engine.Place(n.model, r.Request)
			if err == nil {
				want = c.insert(want, Verdict{Node: n.name, Kept: true, Choice: d.Choice, Best: d.Best, FreeUnits: n.sum.free, index: idx}, 3)
			}
		}
		if (err == nil) != (len(want) > 0) {
			t.Fatalf("request %d %+v: cluster %v, engines afresh %d answers", i, r.Request, err, len(want))
		}
		if err != nil {
			continue
		}
		for k := range want {
			g, w := got.Ranked[k], want[k]
			if g.Node != w.Node || g.Best != w.Best || g.Choice.GPU != w.Choice.GPU {
				t.Fatalf("request %d %+v, rank %d: kept %s %+v, afresh %s %+v", i, r.Request, k, g.Node, g.Best, w.Node, w.Best)
			}
		}
		if rng.IntN(3) == 0 {
			if err := c.Commit(r, got.Ranked[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
}
