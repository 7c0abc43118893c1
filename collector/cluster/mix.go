package cluster

import (
	"math"
	"slices"
	"strings"

	"github.com/gpulet/gpulet/placement"
)

// The frag policy's learner over a whole cluster's requests, the same for
// the collector's placements and gpulet-replay, which both place them: it
// remembers about the last mixWindow requests, weighs the mixShapes most
// frequent shapes, and publishes a new mix every mixEvery requests.
//
// 32 shapes, not 16: a shape is a request's units or GPUs with its CPU and
// memory, so a cluster's many sizes of pods of several whole GPUs each come
// out rare, and with 16 none of them was in the mix, which then kept no
// node's whole GPUs for them. In the FGD paper's protocol on the openb
// multigpu30 list (seed 42) frag allocated 89.9% at 100% arrived with 16
// shapes and 96.6% with 32 (docs/replay.md, "What was tried").
//
// A cluster is asked for the requests of many nodes, where a node learns
// from its own: the last 1,024, a new mix in force every 32
// (agent/policy.go). The window is four times a node's, as it holds many
// nodes' requests. And a new mix costs a cluster more: SetEngine drops
// every node's kept answers and floors, so that the next placement reads
// every node's floor again (10,000 of them in a collector). Every 1,024
// requests keeps that a small share of the placements' cost. The first
// request publishes a mix at once (a Learner without one publishes), so a
// cluster under frag leaves best-fit with it.
const (
	mixWindow = 4096
	mixShapes = 32
	mixEvery  = 1024
)

// NewLearner is a learner of a cluster's request mix (mixWindow, mixShapes,
// mixEvery).
func NewLearner() *placement.Learner { return placement.NewLearner(mixWindow, mixShapes, mixEvery) }

// MixMove is how far a learnt mix must have moved from the one in force
// for a collector to put it in force: its total variation distance (half
// the sum, over the shapes of either, of how much each one's weight
// changed) at least this. A new mix costs the collector's next placement
// of each shape a reading of every node's row for it again (about 12 ms
// at 10,000 nodes: BenchmarkMixSwitch), and a mix learnt from the same
// requests moves by sampling and by the callers' shares alone
// (BenchmarkPlacementsUnderIngest's mix of five shapes moved by under 0.1
// points a publication, about 1 point with a second caller flooding). At 5
// points, a mix of requests that stay alike is put in force once, and a
// shape that grows by 5 points of the requests, or one that comes in with
// them, puts a new one in force.
const MixMove = 0.05

// MixMoved says whether learnt has moved from inForce (nil: none) by
// MixMove or more.
func MixMoved(inForce, learnt *placement.Mix) bool {
	if inForce == nil || learnt == nil {
		return inForce != learnt
	}
	return mixDistance(inForce, learnt) >= MixMove
}

// mixDistance is the total variation distance of two mixes: half the sum,
// over the shapes of either, of how much each one's weight differs.
func mixDistance(a, b *placement.Mix) float64 {
	change := map[placement.Shape]float64{}
	for _, sh := range a.Shapes {
		w := sh.Weight
		sh.Weight = 0
		change[sh] -= w
	}
	for _, sh := range b.Shapes {
		w := sh.Weight
		sh.Weight = 0
		change[sh] += w
	}
	moved := 0.0
	for _, d := range change {
		moved += math.Abs(d)
	}
	return moved / 2
}

// SetEngine replaces the engine (a new mix for the frag policy); the
// answers kept for the old one are dropped. The shapes of e's mix that
// accept only some GPU models are weighed by how scarce those are in the
// cluster as it is now (scarce).
func (c *Cluster) SetEngine(e *placement.Engine) {
	if m := e.Mix(); m != nil {
		e = e.WithMix(c.scarce(m))
	}
	c.engine, c.policy = e, e.Policy()
	for _, n := range c.nodes {
		n.changed()
	}
	// Every row is stale; each table's arrays are kept for the new rows.
	for _, t := range c.tables {
		t.reset(t.key)
	}
}

// ShapeOf is the shape of r as a cluster's mix counts it: the engine's
// (placement.ShapeOf), with the GPU models r accepts, in order, each once.
func ShapeOf(r Request) placement.Shape {
	s := placement.ShapeOf(r.Request)
	if len(r.Models) > 0 {
		models := slices.Clone(r.Models)
		slices.Sort(models)
		s.Models = strings.Join(slices.Compact(models), "|")
	}
	return s
}

// scarce is m with each shape that accepts only some GPU models weighed
// by the cluster's units over the units of the GPUs it accepts (m itself
// when no shape is so restricted). A shape's fragmentation counts the free
// units of the models it does not accept as lost to it, so that taking
// them costs the mix less than taking units it could use: the frag policy
// puts a request that could go anywhere on the models that the restricted
// shapes do not need. Weighed by their share alone, a shape that accepts
// only a scarce model (the V100s of the openb trace, 6% of its GPUs) and
// one that accepts only a plentiful one (its G2s, 71%) steer alike, and
// the scarce GPUs went to requests that could have gone anywhere until
// the requests that could go nowhere else failed (in seed 42 of the
// gpuspec20 list, up to 100% arrived, 81 pods that accept only V100s and
// 45 only G3s failed; weighed by scarcity, 19 and 2). Weighed by
// scarcity, a shape's pull is its demand on the GPUs it can use.
func (c *Cluster) scarce(m *placement.Mix) *placement.Mix {
	if !slices.ContainsFunc(m.Shapes, func(s placement.Shape) bool { return s.Restricted() }) {
		return m
	}
	units := map[string]int{} // by GPU model
	total := 0
	for _, n := range c.nodes {
		for gi := range n.model.GPUs {
			g := &n.model.GPUs[gi]
			units[g.Name] += g.Units
			total += g.Units
		}
	}
	out := &placement.Mix{Shapes: slices.Clone(m.Shapes)}
	for i := range out.Shapes {
		s := &out.Shapes[i]
		if !s.Restricted() {
			continue
		}
		accepted := 0
		for name, u := range units {
			if s.Accepts(name) {
				accepted += u
			}
		}
		if accepted > 0 {
			s.Weight *= float64(total) / float64(accepted)
		}
	}
	return out
}
