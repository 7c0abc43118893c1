// Package placement picks where a lease goes among the places that can take
// it. The lease manager filters candidates (eligibility, type, memory, instance
// health and capacity); a policy here orders what is left. New methods (score,
// affinity) are further policies over the same candidates.
package placement

import (
	"fmt"
	"sort"
	"strings"
)

// Policy names a placement policy.
type Policy string

// The policies.
const (
	BestFit  Policy = "best-fit"
	FirstFit Policy = "first-fit"
	Spread   Policy = "spread"
)

// Policies lists the accepted policies.
var Policies = []Policy{BestFit, FirstFit, Spread}

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
	if s == "score" {
		return "", fmt.Errorf("--policy score is not available in this version; use one of %s", strings.Join(names, ", "))
	}
	return "", fmt.Errorf("--policy %q: must be one of %s", s, strings.Join(names, ", "))
}

// Candidate is one MPS instance of one GPU that can take the request.
type Candidate struct {
	GPU      int
	Instance int
	// Free is the instance's free units; GPUFree the whole GPU's.
	Free    int
	GPUFree int
}

// Choose returns the best candidate under p; ok is false when there is none.
func (p Policy) Choose(cands []Candidate) (best Candidate, ok bool) {
	if len(cands) == 0 {
		return Candidate{}, false
	}
	c := append([]Candidate(nil), cands...)
	byIndex := func(a, b Candidate) bool {
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		return a.Instance < b.Instance
	}
	var less func(a, b Candidate) bool
	switch p {
	case FirstFit:
		less = byIndex
	case Spread:
		// The emptiest GPU, then its emptiest instance.
		less = func(a, b Candidate) bool {
			if a.GPUFree != b.GPUFree {
				return a.GPUFree > b.GPUFree
			}
			if a.Free != b.Free {
				return a.Free > b.Free
			}
			return byIndex(a, b)
		}
	default:
		// Best fit: the GPU whose free units exceed the request by the least,
		// then the tightest instance on it, which keeps large holes whole.
		less = func(a, b Candidate) bool {
			if a.GPUFree != b.GPUFree {
				return a.GPUFree < b.GPUFree
			}
			if a.Free != b.Free {
				return a.Free < b.Free
			}
			return byIndex(a, b)
		}
	}
	sort.Slice(c, func(i, j int) bool { return less(c[i], c[j]) })
	return c[0], true
}
