package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/placement"
)

// spec is a node of gpus GPUs of model, 100 units each, with cpu millicores
// and 64 GiB of memory.
func spec(name, model string, gpus int, cpu uint64) NodeSpec {
	s := NodeSpec{Name: name, Units: 100, CPUMilli: cpu, MemoryMiB: 65536}
	for i := 0; i < gpus; i++ {
		s.GPUs = append(s.GPUs, GPUSpec{Name: model, NUMANode: i / 4})
	}
	return s
}

func newCluster(t *testing.T, p placement.Policy, specs ...NodeSpec) *Cluster {
	t.Helper()
	c := New(placement.New(p))
	for _, s := range specs {
		if err := c.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// place places r and commits it, failing the test if it cannot.
func place(t *testing.T, c *Cluster, r Request) Verdict {
	t.Helper()
	a, err := c.Place(r, 1)
	if err != nil {
		t.Fatalf("place %+v: %v", r, err)
	}
	if err := c.Commit(r, a.Ranked[0]); err != nil {
		t.Fatal(err)
	}
	return a.Ranked[0]
}

func units(u int) Request { return Request{Request: placement.Request{Units: u}} }

func TestClusterPolicies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy placement.Policy
		before []Request // placed first, on whatever node they go to
		req    Request
		node   string
		gpus   []int
		models bool // add node c, of two T4s
	}{
		{name: "first fit: the first node", policy: placement.FirstFit, before: []Request{units(30)}, req: units(10), node: "a"},
		{name: "best fit: the fuller GPU", policy: placement.BestFit, before: []Request{units(30)}, req: units(10), node: "a"},
		{name: "spread: the emptiest", policy: placement.Spread, before: []Request{units(30)}, req: units(10), node: "b"},
		{name: "whole GPUs of one node", policy: placement.BestFit, before: []Request{units(30)}, req: Request{Request: placement.Request{GPUs: 4}}, node: "a", gpus: []int{4, 5, 6, 7}},
		{name: "all eight of the empty node", policy: placement.BestFit, before: []Request{units(30)}, req: Request{Request: placement.Request{GPUs: 8}}, node: "b", gpus: []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{name: "the host's CPU", policy: placement.BestFit, before: []Request{{Request: placement.Request{Units: 10, HostCPUMilli: 60000}}}, req: Request{Request: placement.Request{Units: 10, HostCPUMilli: 8000}}, node: "b"},
		{name: "a GPU model asked", policy: placement.BestFit, req: Request{Request: placement.Request{Units: 10}, Models: []string{"T4", "P100"}}, node: "c", models: true},
		{name: "the node of a model asked", policy: placement.BestFit, req: Request{Request: placement.Request{Units: 10}, Models: []string{"A100", "P100"}}, node: "a", models: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs := []NodeSpec{spec("a", "A100", 8, 64000), spec("b", "A100", 8, 64000)}
			if tc.models {
				specs = append(specs, spec("c", "T4", 2, 64000))
			}
			c := newCluster(t, tc.policy, specs...)
			for _, r := range tc.before {
				if v := place(t, c, r); v.Node != "a" {
					t.Fatalf("the first request went to %s, want a", v.Node)
				}
			}
			v := place(t, c, tc.req)
			if v.Node != tc.node || tc.gpus != nil && !slices.Equal(v.Choice.GPUs, tc.gpus) {
				t.Fatalf("placed on %s %+v, want %s GPUs %v", v.Node, v.Choice, tc.node, tc.gpus)
			}
		})
	}
}

func TestClusterRanksAndRefuses(t *testing.T) {
	c := newCluster(t, placement.BestFit, spec("a", "A100", 1, 8000), spec("b", "A100", 1, 8000), spec("c", "A100", 1, 8000))
	place(t, c, units(50)) // a
	place(t, c, units(20)) // a: 70 taken
	if v := place(t, c, units(10)); v.Node != "a" {
		t.Fatalf("10 units went to %s, want a, the fullest", v.Node)
	}
	a, err := c.Place(units(40), 3)
	if err != nil {
		t.Fatal(err)
	}
	// a has 20 free: it is left out without asking its engine.
	if got := names(a.Ranked); !slices.Equal(got, []string{"b", "c"}) || a.Considered != 2 || a.Nodes != 3 {
		t.Fatalf("ranked %v, considered %d of %d; want b, c, 2 of 3", got, a.Considered, a.Nodes)
	}
	// Fill b and c, then nothing fits.
	place(t, c, units(100))
	place(t, c, units(100))
	_, err = c.Place(units(30), 1)
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a full cluster: %v, want insufficient units", err)
	}
	if _, err := c.Place(Request{Request: placement.Request{Units: 10, HostCPUMilli: 9000}}, 1); err == nil {
		t.Fatal("more CPU than any node has was placed")
	}
	if err := c.Commit(units(1), Verdict{Node: "z"}); err == nil {
		t.Fatal("a commit to no node succeeded")
	}
	if units, free := c.Totals(); units != 300 || free != 20 {
		t.Fatalf("totals %d units, %d free; want 300, 20", units, free)
	}
}

func names(vs []Verdict) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Node)
	}
	return out
}

func TestClusterFragUsesTheMix(t *testing.T) {
	// Node a has a GPU with 40 units free, node b one with 60: a request
	// of 20 leaves a hole of 20 on a, which the mix's requests of 40
	// cannot use; on b it leaves 40 on each node.
	mix := &placement.Mix{Shapes: []placement.Shape{{Units: 20, Weight: 0.5}, {Units: 40, Weight: 0.5}}}
	c := New(placement.New(placement.Frag).WithMix(mix))
	for _, s := range []NodeSpec{spec("a", "T4", 1, 8000), spec("b", "T4", 1, 8000)} {
		if err := c.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct {
		node  string
		units int
	}{{"a", 60}, {"b", 40}} {
		i := c.byName[r.node]
		v, _ := c.Place(units(r.units), 2)
		for _, x := range v.Ranked {
			if x.Node == r.node {
				if err := c.Commit(units(r.units), x); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got := c.nodes[i].model.GPUs[0].Free; got != 100-r.units {
			t.Fatalf("node %s has %d free, want %d", r.node, got, 100-r.units)
		}
	}
	if v := place(t, c, units(20)); v.Node != "b" {
		t.Fatalf("frag put 20 units on %s, want b", v.Node)
	}
	if got := c.Fragmentation(mix); got != 0 {
		t.Fatalf("fragmentation after: %v, want 0", got)
	}
	// a and b both have 40 free now: under best-fit they tie, and the
	// node added first wins.
	c.SetEngine(placement.New(placement.BestFit))
	if a, err := c.Place(units(20), 1); err != nil || a.Ranked[0].Node != "a" {
		t.Fatalf("best-fit after: %+v, %v; want a", a.Ranked, err)
	}
}

// The cluster's choice on one node is the engine's on that node, request
// after request, whatever the policy: it never decides a second way.
func TestClusterAsksTheEngine(t *testing.T) {
	for _, p := range placement.Policies {
		t.Run(string(p), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			s := spec("a", "A100", 8, 1<<20)
			c := newCluster(t, p, s)
			own, err := newNode(s)
			if err != nil {
				t.Fatal(err)
			}
			e := placement.New(p)
			for i := 0; i < 200; i++ {
				r := units(1 + rng.IntN(100))
				if rng.IntN(10) == 0 {
					r = Request{Request: placement.Request{GPUs: 1 + rng.IntN(3)}}
				}
				want, werr := e.Place(own, r.Request)
				a, err := c.Place(r, 1)
				if (werr == nil) != (err == nil) {
					t.Fatalf("request %d %+v: engine %v, cluster %v", i, r, werr, err)
				}
				if err != nil {
					continue
				}
				got := a.Ranked[0].Choice
				if fmt.Sprint(got) != fmt.Sprint(want.Choice) {
					t.Fatalf("request %d %+v: cluster chose %+v, the engine %+v", i, r, got, want.Choice)
				}
				commit(own, r.Request, want.Choice)
				if err := c.Commit(r, a.Ranked[0]); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestAddRefuses(t *testing.T) {
	c := New(placement.New(placement.BestFit))
	if err := c.Add(spec("a", "T4", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(spec("a", "T4", 1, 1)); err == nil {
		t.Error("a node added twice")
	}
	if err := c.Add(NodeSpec{Name: "b"}); err == nil {
		t.Error("a node of 0 units per GPU added")
	}
}

func TestWithout(t *testing.T) {
	for _, tc := range []struct{ free, taken, want []int }{
		{[]int{1, 2, 3, 4}, []int{1, 2}, []int{3, 4}},
		{[]int{1, 2, 3, 4}, []int{2, 4}, []int{1, 3}},
		{[]int{1, 2}, nil, []int{1, 2}},
		{[]int{1, 2}, []int{1, 2}, []int{}},
	} {
		if got := without(slices.Clone(tc.free), tc.taken); !slices.Equal(got, tc.want) {
			t.Errorf("without(%v, %v) = %v, want %v", tc.free, tc.taken, got, tc.want)
		}
	}
}

// Placing by bounds asks fewer engines and answers as asking all of them
// would, limit after limit; so does placing by a shape table, the bounds
// kept in a B-tree, as nodes change, leave and come back.
func TestBoundedAnswersAsAll(t *testing.T) {
	for _, p := range []placement.Policy{placement.BestFit, placement.Spread} {
		t.Run(string(p), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			var specs []NodeSpec
			for i := 0; i < 40; i++ {
				specs = append(specs, spec(fmt.Sprintf("n%02d", i), "A100", 1+rng.IntN(8), 64000))
			}
			c := newCluster(t, p, specs...)
			asked := 0
			for i := 0; i < 300; i++ {
				r := units(1 + rng.IntN(100))
				if rng.IntN(2) == 0 {
					// A few shapes again and again, as a collector is
					// asked, so that its tables' rows are read again.
					r = units([]int{5, 20, 50, 100}[rng.IntN(4)])
				}
				switch rng.IntN(10) {
				case 0:
					r = Request{Request: placement.Request{GPUs: 1 + rng.IntN(4)}}
				case 1:
					r = Request{Request: placement.Request{HostCPUMilli: 1000}}
				}
				if rng.IntN(5) == 0 {
					// A GPU that is failed is known to the engine, not
					// to the bound: the bound must stay optimistic.
					n := c.nodes[rng.IntN(len(c.nodes))]
					n.model.GPUs[0].Unusable = "has failed"
					n.changed()
				}
				switch rng.IntN(20) {
				case 0:
					// A node's leases end: its new snapshot.
					s := specs[rng.IntN(len(specs))]
					if _, ok := c.byName[s.Name]; ok {
						m, err := newNode(s)
						if err != nil {
							t.Fatal(err)
						}
						c.Put(s.Name, m)
					}
				case 1:
					// A node leaves; the last takes its place, and it
					// comes back at the end.
					n := c.nodes[rng.IntN(len(c.nodes))]
					c.Remove(n.name)
					if rng.IntN(2) == 0 {
						c.Put(n.name, n.model)
					}
				}
				for _, limit := range []int{1, 3} {
					var all, bounded Answer
					c.placeAll(&r, limit, &all)
					c.placeBounded(&r, limit, &bounded)
					if fmt.Sprint(names(all.Ranked)) != fmt.Sprint(names(bounded.Ranked)) {
						t.Fatalf("request %d, limit %d: all %v, bounded %v", i, limit, names(all.Ranked), names(bounded.Ranked))
					}
					asked += bounded.Considered
					tabled, err := c.Place(r, limit)
					if (err == nil) != (len(all.Ranked) > 0) || fmt.Sprint(names(all.Ranked)) != fmt.Sprint(names(tabled.Ranked)) {
						t.Fatalf("request %d, limit %d: all %v, by the table %v (%v)", i, limit, names(all.Ranked), names(tabled.Ranked), err)
					}
				}
				if a, err := c.Place(r, 1); err == nil {
					if err := c.Commit(r, a.Ranked[0]); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("%s: %d engines asked for 600 answers over 40 nodes", p, asked)
		})
	}
}

// TestModelHoldsMemoryAsGpuletdDoes: a lease committed to the model holds
// what gpuletd's would (docs/design.md §1.8): its memory_mib, else its
// units' share, so that the model refuses what gpuletd refuses: on one
// A100 80 GB of 16 units, a second 60 GiB lease, and a lease of one unit's
// share once 4 units' share and 60 GiB are held.
func TestModelHoldsMemoryAsGpuletdDoes(t *testing.T) {
	c := newCluster(t, placement.BestFit, NodeSpec{Name: "a", Units: 16, GPUs: []GPUSpec{{Name: "A100-80GB", MemoryTotalMiB: 81920}}})
	big := Request{Request: placement.Request{Units: 1, MemoryMiB: 61440}}
	place(t, c, big)
	if _, err := c.Place(big, 1); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a second 60 GiB lease beside one held: %v", err)
	}
	place(t, c, units(4))
	if _, err := c.Place(units(1), 1); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("one unit's share with 80 GiB held: %v", err)
	}
}
