package config

import (
	"slices"
	"strings"
	"time"
)

// Rules are a config file resolved for one node: what the daemon consults on
// each request. They do not change once made; a new file makes new Rules. A
// nil *Rules is no config: every GPU open to all, no quotas, no profiles,
// default weights.
type Rules struct {
	Pools  []Pool // sorted by name
	Quotas []Quota
	// Profiles maps a task to its run time on each GPU model (by the name
	// NVML reports).
	Profiles map[string]map[string]time.Duration
	Weights  Weights
}

// Pool is a named group of the node's GPUs and who may lease from it.
type Pool struct {
	Name string
	GPUs []int // indices, sorted, each once
	// Everyone may lease from the pool when it is true (the file gave no
	// users); otherwise the uids UIDs and the members of the groups GIDs
	// (both sorted) may, and admins.
	Everyone bool
	UIDs     []uint32
	GIDs     []uint32
}

// Quota caps the units some holders may hold at once.
type Quota struct {
	// Key is the quota as written: "alice", "1001", "group:ml", "*".
	Key  string
	Kind Kind
	// ID is the uid of a User quota, the gid of a Group quota.
	ID    uint32
	Limit int
}

// Pool returns the pool called name.
func (r *Rules) Pool(name string) (*Pool, bool) {
	if r == nil {
		return nil, false
	}
	i, ok := slices.BinarySearchFunc(r.Pools, name, func(p Pool, name string) int { return strings.Compare(p.Name, name) })
	if !ok {
		return nil, false
	}
	return &r.Pools[i], true
}

// Allows says whether a caller with uid and groups gids (its primary group
// and its supplementary ones) may lease from the pool. Admins may lease from
// every pool; that is for the caller to know.
func (p *Pool) Allows(uid uint32, gids []uint32) bool {
	if p == nil {
		return false
	}
	if p.Everyone {
		return true
	}
	if _, ok := slices.BinarySearch(p.UIDs, uid); ok {
		return true
	}
	for _, g := range gids {
		if _, ok := slices.BinarySearch(p.GIDs, g); ok {
			return true
		}
	}
	return false
}

// MayUseGPU says whether a request that names no pool may be placed on the GPU
// index for a caller with uid and groups gids: yes when the GPU is in no
// pool, or in a pool that allows the caller.
func (r *Rules) MayUseGPU(index int, uid uint32, gids []uint32) bool {
	if r == nil {
		return true
	}
	pooled := false
	for i := range r.Pools {
		p := &r.Pools[i]
		if _, ok := slices.BinarySearch(p.GPUs, index); ok {
			if p.Allows(uid, gids) {
				return true
			}
			pooled = true
		}
	}
	return !pooled
}

// Applies says whether the quota counts the units of a holder with uid and
// groups gids: a User quota those of its uid, a Group quota those of the
// group's members, Everyone's those of all.
func (q Quota) Applies(uid uint32, gids []uint32) bool {
	switch q.Kind {
	case User:
		return q.ID == uid
	case Group:
		return slices.Contains(gids, q.ID)
	}
	return q.Kind == Everyone
}

// Profile returns the run time of task on each GPU model it has one for, or
// nil. The map is the Rules'; do not change it.
func (r *Rules) Profile(task string) map[string]time.Duration {
	if r == nil {
		return nil
	}
	return r.Profiles[task]
}

// ScoreWeights returns the score policy's weights: the file's, or 1/3 each.
func (r *Rules) ScoreWeights() Weights {
	if r == nil || r.Weights == (Weights{}) {
		return DefaultWeights
	}
	return r.Weights
}
