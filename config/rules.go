package config

import (
	"slices"
	"strings"
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// Rules are a config file resolved for one node: what the daemon consults on
// each request. They do not change once made; a new file makes new Rules. A
// nil *Rules is no config: every GPU open to all, no quotas, no profiles,
// default weights.
type Rules struct {
	Pools  []placement.Pool // sorted by name
	Quotas []Quota
	// Profiles maps a task to its run time on each GPU model (by the name
	// NVML reports).
	Profiles map[string]map[string]time.Duration
	Weights  placement.Weights
	// MaxUserPriority is the file's reservations.max_user_priority; nil:
	// not given (UserPriorityCeiling says what applies).
	MaxUserPriority *int
	// Skipped says, one line each in the file's order, the rules left out
	// because a user or group name could not be resolved: "line 4:
	// pools.p.users[1]: no user \"bob\" on this machine; the pool's entry is
	// skipped".
	Skipped []string
}

// Quota caps the units some holders may hold at once.
type Quota struct {
	// Key is the quota as written: "alice", "1001", "group:ml", "*".
	Key  string
	Kind identity.Kind
	// ID is the uid of a User quota, the gid of a Group quota.
	ID    uint32
	Limit int
}

// Pool returns the pool called name.
func (r *Rules) Pool(name string) (*placement.Pool, bool) {
	if r == nil {
		return nil, false
	}
	i, ok := slices.BinarySearchFunc(r.Pools, name, func(p placement.Pool, name string) int { return strings.Compare(p.Name, name) })
	if !ok {
		return nil, false
	}
	return &r.Pools[i], true
}

// ScoreWeights returns the score policy's weights: the file's, or 1/3 each.
func (r *Rules) ScoreWeights() placement.Weights {
	if r == nil || r.Weights == (placement.Weights{}) {
		return placement.DefaultWeights
	}
	return r.Weights
}

// ModelsNotIn lists, sorted and each once, the GPU models the file's task
// profiles name that are not among models (a node's GPU names): a typo in a
// model name would otherwise match no GPU, silently. A config shared by
// nodes of different GPUs names models some nodes lack, so this is a warning,
// never an error.
func (f *File) ModelsNotIn(models []string) []string {
	var out []string
	for _, byModel := range f.Profiles {
		for m := range byModel {
			if !slices.Contains(models, m) && !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}
