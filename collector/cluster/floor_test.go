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
// are committed, nodes change, leave and come back, and the mix changes.
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
		var gone []*node
		var shapes []Request
		for range 1 + rng.IntN(maxShapeTables+2) {
			// Mostly asking nothing of the host, as the collector's
			// requests, which the cluster keeps tables of.
			r := randomClusterRequest(rng)
			if rng.IntN(4) > 0 {
				r.HostCPUMilli, r.HostMemoryMiB = 0, 0
			}
			shapes = append(shapes, r)
		}
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
			switch rng.IntN(30) {
			case 0:
				// A node's leases end: its new snapshot is of an empty
				// node, whose floors fall.
				k := rng.IntN(len(specs))
				if _, ok := c.byName[specs[k].Name]; ok {
					m, err := newNode(specs[k])
					if err != nil {
						t.Fatal(err)
					}
					c.Put(specs[k].Name, m)
				}
			case 1:
				// A node leaves the table: the last one takes its place.
				if len(c.nodes) > 2 {
					n := c.nodes[rng.IntN(len(c.nodes))]
					c.Remove(n.name)
					gone = append(gone, n)
				}
			case 2:
				// One comes back, at the end, or a new empty one is added.
				if len(gone) > 0 && rng.IntN(2) == 0 {
					n := gone[len(gone)-1]
					gone = gone[:len(gone)-1]
					c.Put(n.name, n.model)
					break
				}
				s := specs[rng.IntN(len(specs))]
				s.Name = fmt.Sprintf("new%03d", i)
				if err := c.Add(s); err != nil {
					t.Fatal(err)
				}
			}
			r, limit := randomClusterRequest(rng), 1+rng.IntN(4)
			if trial%2 == 0 {
				// A few shapes again and again, as a learnt mix asks,
				// so that the cluster's kept rows are read again.
				r = shapes[rng.IntN(len(shapes))]
			}
			got, err := c.Place(r, limit)
			want := everyEngine(c, r, limit)
			if (err == nil) != (len(want) > 0) {
				t.Fatalf("trial %d, request %d %+v: cluster %v, every engine %d answers", trial, i, r, err, len(want))
			}
			if err != nil {
				continue
			}
			if fit := mayFitCount(c, r); got.Considered > fit {
				t.Fatalf("trial %d, request %d %+v: %d nodes asked, only %d may fit", trial, i, r, got.Considered, fit)
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

// mayFitCount is how many nodes may fit r on their summary: no more can be
// asked.
func mayFitCount(c *Cluster, r Request) int {
	count := 0
	for _, n := range c.nodes {
		if n.sum.mayFit(&r) {
			count++
		}
	}
	return count
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
		switch rng.IntN(10) {
		case 0, 1:
			sh.Type = []string{"t4", "a100"}[rng.IntN(2)]
		case 2, 3:
			// As a pod's GPU specification lists them, one the
			// cluster lacks among them; the cluster weighs these by
			// scarcity.
			sh.Models = []string{"A100", "T4", "A100|T4", "H100|T4", "H100"}[rng.IntN(5)]
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
