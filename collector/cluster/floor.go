package cluster

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
)

// Under the frag policy a node's answer is ranked first by how much its
// choice raises the node's expected fragmentation (Candidate.Frag), and the
// engine gives floors under that figure for any choice it could make:
// placement.Engine.FragFloor, which the node's memo keeps while the node
// stays as it is, and FragLeast, tighter where FragFloor is not already
// (a request that leaves the host short). The figures that break ties are
// known without the engine's decision: the node's Align
// (placement.Engine.Align), its free units (the summary's), and its GPU's
// free units, bounded as best-fit bounds them. So a placement asks the
// nodes in the order of their floors until every node left is beaten: no
// node left out could have come before the answers kept. At 10,000 nodes
// it reads 10,000 kept floors and asks a few engines, not 10,000.

// floorCand is a node to ask, with a floor under its figure: the tighter
// one once tight is set.
type floorCand struct {
	floor float64
	tight bool
	index int
}

// floorHeap is the nodes left to ask, the lowest floor on top.
type floorHeap []floorCand

func (h floorHeap) Len() int { return len(h) }
func (h floorHeap) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(h[i].floor, h[j].floor), cmp.Compare(h[i].index, h[j].index)) < 0
}
func (h floorHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *floorHeap) Push(x any)   { *h = append(*h, x.(floorCand)) }
func (h *floorHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// placeFloored asks the nodes in the order of their floors, a node's
// tighter floor read when its cheap one comes on top, so that the tighter
// one is read only for the nodes whose cheap one is not beaten, and a node
// is asked only when no node left has a lower floor. The node of the
// lowest cheap floor is asked first, without a heap: usually most nodes
// are beaten by its answer alone. A request with a shape table is placed
// by its table instead (placeTabled).
func (c *Cluster) placeFloored(r *Request, limit int, a *Answer) {
	h := c.floorScratch[:0]
	lowest := -1
	for i, n := range c.nodes {
		if n.sum.mayFit(r) {
			floor := c.engine.FragFloor(n.model, r.Request, &n.memo)
			h = append(h, floorCand{floor: floor, index: i})
			if lowest < 0 || h.Less(len(h)-1, lowest) {
				lowest = len(h) - 1
			}
		}
	}
	ask := func(cd floorCand) {
		n := c.nodes[cd.index]
		a.Considered++
		if v := c.ask(n, r); v.kept {
			a.Ranked = c.insert(a.Ranked, Verdict{Node: n.name, Kept: true, Choice: v.choice, Best: v.best, FreeUnits: n.sum.free, index: cd.index}, limit)
		}
	}
	if lowest >= 0 {
		ask(h[lowest])
		h[lowest] = h[len(h)-1]
		h = h[:len(h)-1]
	}
	// The nodes whose floor is above the last answer's figure are beaten
	// whatever else they have; when those left all have a floor at it,
	// they tie (a request of no GPU, whose floor is its figure, on nodes
	// alike) and need no order.
	least := math.Inf(1)
	h = slices.DeleteFunc(h, func(cd floorCand) bool {
		if len(a.Ranked) == limit && cd.floor > a.Ranked[limit-1].Best.Frag {
			return true
		}
		least = min(least, cd.floor)
		return false
	})
	if len(a.Ranked) == limit && least >= a.Ranked[limit-1].Best.Frag {
		c.askTies(h, r, limit, a, ask)
		c.floorScratch = h[:0]
		return
	}
	heap.Init(&h)
	for h.Len() > 0 {
		cd := h[0]
		full := len(a.Ranked) == limit
		if full && cd.floor >= a.Ranked[limit-1].Best.Frag {
			// The nodes left tie with the last answer kept at best:
			// their order no longer matters.
			c.askTies(h, r, limit, a, ask)
			break
		}
		n := c.nodes[cd.index]
		if !cd.tight {
			h[0].floor, h[0].tight = c.engine.FragLeast(n.model, r.Request, &n.memo), true
			heap.Fix(&h, 0)
			continue
		}
		heap.Pop(&h)
		ask(cd)
	}
	c.floorScratch = h[:0]
}

// askTies asks, in any order, the nodes of cands not beaten by the answers
// kept, every one of which has a floor at least the last answer's figure.
func (c *Cluster) askTies(cands []floorCand, r *Request, limit int, a *Answer, ask func(floorCand)) {
	for _, cd := range cands {
		if c.beaten(cd, r, a.Ranked, limit) {
			continue
		}
		if !cd.tight {
			n := c.nodes[cd.index]
			cd.floor = c.engine.FragLeast(n.model, r.Request, &n.memo)
			if c.beaten(cd, r, a.Ranked, limit) {
				continue
			}
		}
		ask(cd)
	}
}

// beaten says whether the node of cd can be among the limit best of ranked
// no more: the best answer it could give, its figure at its floor, would
// not come before the last of them.
func (c *Cluster) beaten(cd floorCand, r *Request, ranked []Verdict, limit int) bool {
	if len(ranked) < limit {
		return false
	}
	last := ranked[limit-1]
	switch {
	case cd.floor > last.Best.Frag:
		return true
	case cd.floor < last.Best.Frag:
		return false
	}
	best := c.tiesOf(c.nodes[cd.index], r).key(cd.index)
	best.floor = cd.floor
	return !best.less(c.keyOf(last))
}
