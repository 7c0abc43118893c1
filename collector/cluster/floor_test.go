package cluster

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gpulet/gpulet/placement"
)

// TestFloorsRankAsEveryEngine: under the frag policy, on random clusters
// (nodes of one to eight GPUs of two models, hosts that run short, GPUs
// that fail) under random mixes, the nodes a placement leaves unasked by
// their floors change nothing: its answers are those of asking every
// node's engine, in the same order, request after request, as placements
// are committed, nodes change and the mix changes.
func TestFloorsRankAsEveryEngine(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 16 {
		var specs []NodeSpec
		for i := range 10 + rng.IntN(50) {
			s := spec(fmt.Sprintf("n%02d", i), []string{"T4", "A100"}[rng.IntN(2)], 1+rng.IntN(8), uint64(8000+rng.IntN(8)*8000))
			s.MemoryMiB = uint64(16384 * (1 + rng.IntN(4)))
			specs = append(specs, s)
		}
		c := newCluster(t, placement.Frag, specs...)
		for i := range 300 {
			if i%100 == 0 {
				// Before the first mix, every figure is 0.
				mix := randomClusterMix(rng)
				if rng.IntN(4) == 0 {
					mix = nil
				}
				c.SetEngine(placement.New(placement.Frag).WithMix(mix))
			}
			if rng.IntN(40) == 0 {
				// A GPU fails: the node's new snapshot.
				n := c.nodes[rng.IntN(len(c.nodes))]
				n.model.GPUs[rng.IntN(len(n.model.GPUs))].Unusable = "is failed"
				c.Put(n.name, n.model)
			}
			r, limit := randomClusterRequest(rng), 1+rng.IntN(4)
			got, err := c.Place(r, limit)
			want := everyEngine(c, r, limit)
			if (err == nil) != (len(want) > 0) {
				t.Fatalf("trial %d, request %d %+v: cluster %v, every engine %d answers", trial, i, r, err, len(want))
			}
			if err != nil {
				continue
			}
			if len(got.Ranked) != len(want) {
				t.Fatalf("trial %d, request %d %+v: %d answers, every engine %d", trial, i, r, len(got.Ranked), len(want))
			}
			for k := range want {
				g, w := got.Ranked[k], want[k]
				if g.Node != w.Node || g.Best != w.Best || g.FreeUnits != w.FreeUnits || !reflect.DeepEqual(g.Choice, w.Choice) {
					t.Fatalf("trial %d, request %d %+v, rank %d:\nfloors       %s %+v %+v\nevery engine %s %+v %+v", trial, i, r, k, g.Node, g.Best, g.Choice, w.Node, w.Best, w.Choice)
				}
			}
			if rng.IntN(2) == 0 {
				if err := c.Commit(r, got.Ranked[0]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// everyEngine is the limit best answers of asking the engine of every
// node that may fit r, afresh.
func everyEngine(c *Cluster, r Request, limit int) []Verdict {
	var out []Verdict
	for i, n := range c.nodes {
		if !n.sum.mayFit(&r) {
			continue
		}
		if d, err := c.decide(n, &r, true); err == nil {
			out = c.insert(out, Verdict{Node: n.name, Kept: true, Choice: d.Choice, Best: d.Best, FreeUnits: n.sum.free, index: i}, limit)
		}
	}
	return out
}

func randomClusterMix(rng *rand.Rand) *placement.Mix {
	m := &placement.Mix{}
	for range 1 + rng.IntN(10) {
		sh := placement.Shape{Weight: rng.Float64(), HostCPUMilli: uint64(rng.IntN(5) * 4000), HostMemoryMiB: uint64(rng.IntN(5) * 8192)}
		switch rng.IntN(5) {
		case 0:
			sh.GPUs = 1 + rng.IntN(4)
		case 1:
		default:
			sh.Units = 1 + rng.IntN(100)
		}
		if rng.IntN(5) == 0 {
			sh.Type = []string{"t4", "a100"}[rng.IntN(2)]
		}
		m.Shapes = append(m.Shapes, sh)
	}
	return m
}

func randomClusterRequest(rng *rand.Rand) Request {
	r := Request{Request: placement.Request{HostCPUMilli: uint64(rng.IntN(5) * 2000), HostMemoryMiB: uint64(rng.IntN(5) * 4096)}}
	switch rng.IntN(6) {
	case 0:
		r.GPUs = 1 + rng.IntN(3)
	case 1:
	default:
		r.Units = 1 + rng.IntN(100)
	}
	switch rng.IntN(6) {
	case 0:
		r.Models = []string{"T4"}
	case 1:
		r.Type = "a100"
	}
	return r
}
