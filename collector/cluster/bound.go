package cluster

import (
	"cmp"
	"slices"

	"github.com/gpulet/gpulet/placement"
)

// Under best-fit and spread a node's answer to a fractional request is
// ranked by the free units of the GPU its engine chose, and that GPU's free
// units can be bounded from the node's summary without asking: best-fit
// chooses a GPU with at least as many free units as the tightest that has
// enough (the engine may pass that one over for a reason the summary does
// not know, never for a tighter one), spread one with at most as many as the
// emptiest. So the nodes are asked in the order of their bounds, and asking
// stops once no node left could come before the answers already had: at
// 10,000 nodes a placement asks a few engines, not 10,000.

// A whole-GPU request's choice is ranked by the units of the GPUs it takes,
// bounded by the node's smallest and largest GPU; a request for no GPU's by
// nothing (0), and the node's free units decide.

// bounded says whether requests are placed by bounds under the policy.
func (c *Cluster) bounded() bool {
	return c.policy == placement.BestFit || c.policy == placement.Spread
}

// bound is the best GPU free units the engine of a node of summary s could
// rank its choice for r by, under policy p.
func (s *summary) bound(p placement.Policy, r *Request) int {
	spread := p == placement.Spread
	switch {
	case r.GPUs > 0 && spread:
		return r.GPUs * s.maxUnits
	case r.GPUs > 0:
		return r.GPUs * s.minUnits
	case r.Units <= 0:
		return 0
	case spread:
		return s.maxFree
	}
	b := -1
	for _, f := range s.frees {
		if f >= r.Units && (b < 0 || f < b) {
			b = f
		}
	}
	return b
}

// boundCand is a node to ask, with its bound.
type boundCand struct{ bound, free, index int }

// pickRounds is how many nodes placeBounded takes by a scan for the best
// left before it sorts the rest: usually the first node asked is the
// answer, and one scan costs less than a sort.
const pickRounds = 8

func (c *Cluster) placeBounded(r *Request, limit int, a *Answer) {
	cands := c.scratch[:0]
	for i, n := range c.nodes {
		if n.sum.mayFit(r) {
			cands = append(cands, boundCand{n.sum.bound(c.policy, r), n.sum.free, i})
		}
	}
	c.scratch = cands
	sign := 1
	if c.policy == placement.Spread {
		sign = -1
	}
	order := func(x, y boundCand) int {
		return cmp.Or(sign*cmp.Compare(x.bound, y.bound), sign*cmp.Compare(x.free, y.free), cmp.Compare(x.index, y.index))
	}
	// ask asks the node of cd unless no node from it on can be among the
	// limit best; it says whether to go on.
	ask := func(cd boundCand) bool {
		if len(a.Ranked) == limit && !c.before(Verdict{Best: placement.Candidate{GPUFree: cd.bound}, FreeUnits: cd.free, index: cd.index}, a.Ranked[limit-1]) {
			return false
		}
		n := c.nodes[cd.index]
		a.Considered++
		if v := c.ask(n, r); v.kept {
			a.Ranked = c.insert(a.Ranked, Verdict{Node: n.name, Kept: true, Choice: v.choice, Best: v.best, FreeUnits: n.sum.free, index: cd.index}, limit)
		}
		return true
	}
	for round := 0; round < pickRounds && len(cands) > 0; round++ {
		best := 0
		for j := 1; j < len(cands); j++ {
			if order(cands[j], cands[best]) < 0 {
				best = j
			}
		}
		cd := cands[best]
		cands[best] = cands[len(cands)-1]
		cands = cands[:len(cands)-1]
		if !ask(cd) {
			return
		}
	}
	slices.SortFunc(cands, order)
	for _, cd := range cands {
		if !ask(cd) {
			return
		}
	}
}
