package placement

import (
	"math"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// The score policy (docs/design.md §1.8): among the GPUs that pass every
// filter, the one with the highest S_card + S_similarity wins; on it, the
// tightest instance, as best-fit takes. docs/placement.md has the formula, why
// it is built so, and a worked example that score_doc_test.go checks.

// Card is what a GPU is, as the score policy and the min_cc filter see it. A
// figure the backend could not read is zero: the weakest.
type Card struct {
	CC                  api.ComputeCapability
	MemoryBandwidthGBps int
	// SMClockMHz is the SM clock's maximum (boost) clock.
	SMClockMHz int
}

// Weights weigh the card's facts in S_card = CC·cc + Bandwidth·bw + Clock·clock
// (the config file's score section, which checks them). They are used as
// given: their sum is how much S_card, whose facts each lie in [0,1], counts
// against S_similarity, which lies in [0,1] too.
type Weights struct {
	CC, Bandwidth, Clock float64
}

// DefaultWeights give each fact a third: S_card and S_similarity then both lie
// in [0,1] and count alike (docs/design.md §1.8).
var DefaultWeights = Weights{CC: 1.0 / 3, Bandwidth: 1.0 / 3, Clock: 1.0 / 3}

// WithWeights returns a copy of e that scores with w, for a config that sets
// them; e itself is not changed, since decisions may be using it.
func (e *Engine) WithWeights(w Weights) *Engine {
	c := *e
	c.weights = w
	return &c
}

// GPUScore is one GPU's score for one request, with its parts for a dry run.
type GPUScore struct {
	// CC, Bandwidth and Clock are the card's facts min–max normalized over
	// the node's GPUs: 0 for the node's weakest, 1 for its strongest, and 1
	// for every GPU when all are alike.
	CC, Bandwidth, Clock float64
	// Card is S_card: the weighted sum of CC, Bandwidth and Clock.
	Card float64
	// Similarity is S_similarity: the cosine of the angle between what the
	// GPU has free and what the request asks, both as shares of the GPU.
	Similarity float64
	// Total is Card + Similarity: the highest wins.
	Total float64
}

// scorer scores GPUs of one node for one decision. It knows the node's range
// of each fact, read once per decision from the node's GPUs (all of them,
// usable or not, so that a GPU's S_card does not move as others fill up).
type scorer struct {
	w             Weights
	cc, bw, clock span
}

// span is the lowest and highest value of one fact over the node's GPUs.
type span struct{ lo, hi float64 }

func (s *span) add(v float64, first bool) {
	if first || v < s.lo {
		s.lo = v
	}
	if first || v > s.hi {
		s.hi = v
	}
}

// norm places v in the span: min–max, so that on a mixed node each fact
// spans the whole [0,1] and the weights mean what they say (divided by the
// maximum, compute capabilities 7.5 to 9.0 would span only 0.83 to 1 while
// bandwidths span 0.1 to 1). When every GPU has the same value the fact tells
// none apart: 1 for all, as strong as the strongest.
func (s span) norm(v float64) float64 {
	if s.hi == s.lo {
		return 1
	}
	return (v - s.lo) / (s.hi - s.lo)
}

// ccValue reads a compute capability as the decimal number it is written as:
// 8.6 is 8.6. Minors stay below 10, so the order is kept.
func ccValue(c api.ComputeCapability) float64 { return float64(c.Major) + float64(c.Minor)/10 }

// newScorer reads the node's range of each fact: O(GPUs).
func newScorer(n *Node, w Weights) scorer {
	s := scorer{w: w}
	for i := range n.GPUs {
		c := &n.GPUs[i].Card
		first := i == 0
		s.cc.add(ccValue(c.CC), first)
		s.bw.add(float64(c.MemoryBandwidthGBps), first)
		s.clock.add(float64(c.SMClockMHz), first)
	}
	return s
}

// score is g's score for r: O(1).
func (s *scorer) score(g *GPU, r Request) GPUScore {
	sc := GPUScore{
		CC:        s.cc.norm(ccValue(g.Card.CC)),
		Bandwidth: s.bw.norm(float64(g.Card.MemoryBandwidthGBps)),
		Clock:     s.clock.norm(float64(g.Card.SMClockMHz)),
	}
	sc.Card = s.w.CC*sc.CC + s.w.Bandwidth*sc.Bandwidth + s.w.Clock*sc.Clock
	free, asked := vectors(g, r)
	sc.Similarity = cosine(free, asked)
	sc.Total = sc.Card + sc.Similarity
	return sc
}

// vectors are what g has free and what r asks of it, each component a share
// of the GPU's own total, so that units (tens) and MiB (tens of thousands)
// weigh alike: (units free/units, memory free/memory) and (units asked/units,
// memory asked/memory). A request without memory_mib asks its units' share of
// the memory, as its lease's memory limit would be. A total the GPU does not
// know (0) makes that component 0 on both sides: it then tells nothing.
func vectors(g *GPU, r Request) (free, asked [2]float64) {
	if g.Units > 0 {
		free[0] = float64(g.Free) / float64(g.Units)
		asked[0] = float64(r.Units) / float64(g.Units)
	}
	if g.MemoryTotalMiB > 0 {
		mem := r.MemoryMiB
		if mem == 0 && g.Units > 0 {
			mem = pipefile.MemoryShareMiB(r.Units, g.Units, g.MemoryTotalMiB)
		}
		free[1] = float64(g.MemoryFreeMiB) / float64(g.MemoryTotalMiB)
		asked[1] = float64(mem) / float64(g.MemoryTotalMiB)
	}
	return free, asked
}

// cosine is the cosine similarity of a and b, 0 when either is all zero. Both
// have no negative component, so it lies in [0,1]: 1 when the GPU's free
// resources have the request's shape (say, as much memory per unit free as
// the request asks per unit), lower the more they differ. It compares shapes,
// not amounts: docs/placement.md says what that means for a decision.
func cosine(a, b [2]float64) float64 {
	dot := a[0]*b[0] + a[1]*b[1]
	na := math.Hypot(a[0], a[1])
	nb := math.Hypot(b[0], b[1])
	if na == 0 || nb == 0 {
		return 0
	}
	return min(dot/(na*nb), 1)
}

// scoreResolution is the step scores are compared at. Two GPUs whose scores
// are equal on paper (two alike GPUs, equally loaded) can differ in the last
// bits of a float by the order of the arithmetic; compared at this step they
// tie, and the tie is broken as the policy says, not by rounding noise.
const scoreResolution = 1e-9

// rank is the score's total as decisions compare it.
func (s GPUScore) rank() float64 { return roundScore(s.Total) }

// roundScore is v at scoreResolution.
func roundScore(v float64) float64 { return math.Round(v/scoreResolution) * scoreResolution }
