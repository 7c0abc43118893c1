package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// GPURef is one GPU of the node: its index and UUID.
type GPURef struct {
	Index int
	UUID  string
}

// Resolve makes the file's rules for a node with the GPUs gpus, looking user
// and group names up in dir. A GPU the node does not have is an error, an
// *Error on the earliest such line. A user or group dir does not know (deleted
// since the file was written, or a directory service that does not answer) is
// not: that rule is skipped, a pool's user entry or a quota, and said in the
// Rules' Skipped, so that a node whose user database changed still starts.
// Skipping fails closed: a pool loses a member, never gains one.
func (f *File) Resolve(gpus []GPURef, dir identity.Directory) (*Rules, error) {
	r, res := f.resolve(gpus, true, dir)
	if res.firstGPU != nil {
		return nil, res.firstGPU
	}
	return r, nil
}

// Check is the check of the file for a node with the GPUs gpus: the problem
// on the earliest line, a name dir does not know included, as an *Error; nil
// when Resolve would skip nothing.
func (f *File) Check(gpus []GPURef, dir identity.Directory) error {
	_, res := f.resolve(gpus, true, dir)
	if res.first != nil {
		return res.first
	}
	return nil
}

// CheckNames looks the file's user and group names up in dir, for a check of
// the file away from the node it is for: what Resolve does but for the GPUs,
// and a name dir does not know is an error, the one on the earliest line.
func (f *File) CheckNames(dir identity.Directory) error {
	_, res := f.resolve(nil, false, dir)
	if res.first != nil {
		return res.first
	}
	return nil
}

// resolve makes the rules, skipping the entries whose names dir does not
// resolve, and returns the resolver, which holds the problems met.
func (f *File) resolve(gpus []GPURef, checkGPUs bool, dir identity.Directory) (*Rules, *resolver) {
	res := &resolver{dir: dir, users: map[string]uint32{}, groups: map[string]uint32{}}
	r := &Rules{Weights: f.Weights, MaxUserPriority: f.MaxUserPriority}
	for _, ps := range f.Pools {
		p := placement.Pool{Name: ps.Name, Set: identity.Set{Everyone: ps.Everyone}}
		for _, who := range ps.Users {
			id, ok := res.id(who, "the pool's entry is skipped")
			switch {
			case !ok:
			case who.Kind == identity.User:
				p.UIDs = append(p.UIDs, id)
			default:
				p.GIDs = append(p.GIDs, id)
			}
		}
		if checkGPUs {
			for _, g := range ps.GPUs {
				if i, err := findGPU(g, gpus); err != nil {
					res.failGPU(g.Line, g.path, err)
				} else {
					p.GPUs = append(p.GPUs, i)
				}
			}
		}
		p.GPUs, p.UIDs, p.GIDs = sortedSet(p.GPUs), sortedSet(p.UIDs), sortedSet(p.GIDs)
		r.Pools = append(r.Pools, p)
	}
	slices.SortFunc(r.Pools, func(a, b placement.Pool) int { return strings.Compare(a.Name, b.Name) })
	for _, q := range f.Quotas {
		if id, ok := res.id(q.Who, "the quota is skipped"); ok {
			r.Quotas = append(r.Quotas, Quota{Key: q.Who.String(), Kind: q.Who.Kind, ID: id, Limit: q.Limit})
		}
	}
	slices.SortStableFunc(res.skipped, func(a, b *Error) int { return a.Line - b.Line })
	for _, e := range res.skipped {
		r.Skipped = append(r.Skipped, e.Error())
	}
	if f.Profiles != nil {
		r.Profiles = make(map[string]map[string]time.Duration, len(f.Profiles))
		for task, times := range f.Profiles {
			r.Profiles[task] = maps.Clone(times)
		}
	}
	return r, res
}

// resolver looks each name up once, and keeps the problem on the earliest
// line (entries are met pool by pool, not in the file's order), the GPU
// problem on the earliest line, and every name it could not resolve.
type resolver struct {
	dir             identity.Directory
	users, groups   map[string]uint32
	first, firstGPU *Error
	skipped         []*Error
}

// id is who's uid or gid; false when it could not be had (then the entry is
// recorded as skipped, with the consequence said). Everyone has none.
func (res *resolver) id(who Principal, consequence string) (uint32, bool) {
	if who.Kind == identity.Everyone {
		return 0, true
	}
	if who.ByID {
		return who.ID, true
	}
	known, lookup := res.users, res.dir.LookupUser
	if who.Kind == identity.Group {
		known, lookup = res.groups, res.dir.LookupGroup
	}
	if id, ok := known[who.Name]; ok {
		return id, true
	}
	id, err := lookup(who.Name)
	if err != nil {
		e := res.fail(who.Line, who.path, err)
		res.skipped = append(res.skipped, &Error{Line: e.Line, Msg: e.Msg + "; " + consequence})
		return 0, false
	}
	known[who.Name] = id
	return id, true
}

func (res *resolver) failGPU(line int, path string, err error) {
	e := res.fail(line, path, err)
	if res.firstGPU == nil || line < res.firstGPU.Line {
		res.firstGPU = e
	}
}

// fail records a problem and returns it.
func (res *resolver) fail(line int, path string, err error) *Error {
	e := &Error{Line: line, Msg: path + ": " + err.Error()}
	if res.first == nil || line < res.first.Line {
		res.first = e
	}
	return e
}

// findGPU returns the index of the node's GPU that g names: by index, or by
// UUID in any case, as a lease request's gpu is matched.
func findGPU(g GPUSpec, gpus []GPURef) (int, error) {
	for _, n := range gpus {
		if g.UUID == "" && n.Index == g.Index || g.UUID != "" && strings.EqualFold(n.UUID, g.UUID) {
			return n.Index, nil
		}
	}
	if g.UUID != "" {
		return 0, fmt.Errorf("no GPU with UUID %q on this node", g.UUID)
	}
	return 0, fmt.Errorf("no GPU with index %d (this node has %d)", g.Index, len(gpus))
}

// sortedSet sorts s and drops repeats: the same GPU may be named by index and
// by UUID, the same user by name and by uid.
func sortedSet[T int | uint32](s []T) []T {
	slices.Sort(s)
	return slices.Compact(s)
}
