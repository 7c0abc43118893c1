package placement

import (
	"fmt"
	"strings"
)

// Policy names a placement policy.
type Policy string

// The policies.
const (
	BestFit  Policy = "best-fit"
	FirstFit Policy = "first-fit"
	Spread   Policy = "spread"
	// Score ranks GPUs by S_card + S_similarity (score.go).
	Score Policy = "score"
	// Frag takes the choice that raises its node's expected fragmentation
	// over the recent request mix the least (frag.go).
	Frag Policy = "frag"
)

// Policies lists the accepted policies.
var Policies = []Policy{BestFit, FirstFit, Spread, Score, Frag}

// ParsePolicy checks a --policy value.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = string(p)
	}
	return "", fmt.Errorf("--policy %q: must be one of %s", s, strings.Join(names, ", "))
}

// Candidate is one MPS instance of one GPU that passed every filter.
type Candidate struct {
	// GPU and Instance are positions in Node.GPUs and GPU.Instances.
	GPU      int
	Instance int
	// Free is the instance's free units; GPUFree the whole GPU's.
	Free    int
	GPUFree int
	// Score is the GPU's score as the score policy compares it; 0 under
	// the other policies.
	Score float64
	// PoolFree is the free units of the fullest pool the GPU is used
	// through; Rank is where the GPU's model stands in the request's Prefer.
	PoolFree int
	Rank     int
	// Frag is how much the choice raises its node's expected fragmentation
	// under the frag policy; 0 under the others.
	Frag float64
	// Align is, under the frag policy on a node with a Host, how alike
	// the request's shape and what the node has free are (HostAlign); it
	// is the same for every GPU of a node, and orders nodes whose Frag ties.
	Align float64
}

// preferring puts the task's faster models first, then the fuller pool,
// and orders what is left by less.
func preferring(less func(a, b Candidate) bool) func(a, b Candidate) bool {
	return func(a, b Candidate) bool {
		if a.Rank != b.Rank {
			return a.Rank < b.Rank
		}
		if a.PoolFree != b.PoolFree {
			return a.PoolFree < b.PoolFree
		}
		return less(a, b)
	}
}

func byIndex(a, b Candidate) bool {
	if a.GPU != b.GPU {
		return a.GPU < b.GPU
	}
	return a.Instance < b.Instance
}

// instanceBefore says whether, on one GPU, an instance with free units
// a comes before the earlier one with free units b under p: what less says of
// two candidates of one GPU, all else about them being equal. A decision
// takes each GPU's best instance this way, then orders the GPUs' best with
// less: one comparison per instance is a pair of ints.
func (p Policy) instanceBefore(a, b int) bool {
	switch p {
	case FirstFit:
		return false
	case Spread:
		return a > b
	}
	return a < b
}

// less orders candidates, best first, under p. A decision keeps the best
// candidate as it goes, in one pass: it must not cost more with more leases
// held, and candidates are at most GPUs × instances.
func (p Policy) less() func(a, b Candidate) bool {
	switch p {
	case FirstFit:
		return byIndex
	case Score:
		// The highest score, then as best-fit: the score's similarity
		// compares the shapes of what is free and what is asked, not their
		// amounts, so GPUs alike in shape tie, and the tighter one keeps the
		// larger holes elsewhere whole.
		return func(a, b Candidate) bool {
			if a.Score != b.Score {
				return a.Score > b.Score
			}
			return bestFit(a, b)
		}
	case Frag:
		// The least fragmentation added, then as best-fit: when the mix
		// loses nothing either way, the tighter GPU keeps larger holes.
		return func(a, b Candidate) bool {
			if a.Frag != b.Frag {
				return a.Frag < b.Frag
			}
			return bestFit(a, b)
		}
	case Spread:
		// The emptiest GPU, then its emptiest instance.
		return func(a, b Candidate) bool {
			if a.GPUFree != b.GPUFree {
				return a.GPUFree > b.GPUFree
			}
			if a.Free != b.Free {
				return a.Free > b.Free
			}
			return byIndex(a, b)
		}
	}
	return bestFit
}

// bestFit puts first the GPU whose free units exceed the request by the
// least, then the tightest instance on it, which keeps large holes whole.
func bestFit(a, b Candidate) bool {
	if a.GPUFree != b.GPUFree {
		return a.GPUFree < b.GPUFree
	}
	if a.Free != b.Free {
		return a.Free < b.Free
	}
	return byIndex(a, b)
}
