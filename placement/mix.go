package placement

import (
	"cmp"
	"slices"
	"sync"
)

// Learner learns the recent request mix from the requests placed, for the
// frag policy. It is the only state the policy has, and it stays outside the
// engine: the caller observes each request it placed and hands the engine
// the Mix it publishes (Engine.WithMix), so a decision stays pure. Safe for
// concurrent use.
type Learner struct {
	mu sync.Mutex // guards everything below
	// counts weighs each shape seen; older requests weigh less, halved
	// each time the total passes window.
	counts map[Shape]float64
	total  float64
	window float64
	keep   int
	every  int
	since  int
	mix    *Mix
}

// NewLearner makes a learner that remembers about window requests (older
// ones fade by halves), keeps the keep most frequent shapes in its mix, and
// publishes a new mix every every requests observed (a decision costs as
// many passes over a node's GPUs as the mix has shapes).
func NewLearner(window, keep, every int) *Learner {
	return &Learner{counts: map[Shape]float64{}, window: float64(max(window, 1)), keep: max(keep, 1), every: max(every, 1)}
}

// ShapeOf is the shape of r as a mix counts it.
func ShapeOf(r Request) Shape {
	s := Shape{Units: r.Units, GPUs: r.GPUs, Type: r.Type, HostCPUMilli: r.HostCPUMilli, HostMemoryMiB: r.HostMemoryMiB}
	if s.GPUs > 0 {
		s.Units = 0
	}
	return s
}

// Observe counts one request that arrived. A request of no GPU is not
// counted: no choice changes what of the GPU it could use (none), so, as in
// FGD, it would steer no decision, only take a place among the shapes
// kept; counted as the shape of a host's CPU and memory, it made the
// policy keep CPU free for requests that use no GPU.
func (l *Learner) Observe(r Request) {
	if r.Units == 0 && r.GPUs == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[ShapeOf(r)]++
	l.total++
	if l.total > l.window {
		kept := make([]Shape, 0, len(l.counts))
		for s, c := range l.counts {
			if c /= 2; c < 0.5 {
				delete(l.counts, s)
				continue
			}
			l.counts[s] = c
			kept = append(kept, s)
		}
		// Summed in the shapes' order, not the map's: float addition is
		// not associative, and the same requests must give the same mix
		// (a replay, run again, places as it did).
		slices.SortFunc(kept, byFields)
		l.total = 0
		for _, s := range kept {
			l.total += l.counts[s]
		}
	}
	if l.since++; l.since >= l.every || l.mix == nil {
		l.since = 0
		l.mix = l.publishLocked()
	}
}

// Mix is the mix as last published: nil before any request of GPU was
// observed.
func (l *Learner) Mix() *Mix {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mix
}

// publishLocked makes a mix of the keep most frequent shapes, each weighed
// by its share of all the requests remembered.
func (l *Learner) publishLocked() *Mix {
	shapes := make([]Shape, 0, len(l.counts))
	for s, c := range l.counts {
		s.Weight = c / l.total
		shapes = append(shapes, s)
	}
	// Ties by the shape's fields, so that a mix does not depend on the
	// map's order.
	slices.SortFunc(shapes, func(a, b Shape) int {
		return cmp.Or(cmp.Compare(b.Weight, a.Weight), byFields(a, b))
	})
	if len(shapes) > l.keep {
		shapes = shapes[:l.keep]
	}
	return &Mix{Shapes: shapes}
}

// byFields orders shapes by their fields, but for Weight.
func byFields(a, b Shape) int {
	return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.Units, b.Units),
		cmp.Compare(a.HostCPUMilli, b.HostCPUMilli), cmp.Compare(a.HostMemoryMiB, b.HostMemoryMiB), cmp.Compare(a.Type, b.Type))
}
