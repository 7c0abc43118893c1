package config

import (
	"errors"
	"fmt"
	"maps"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GPURef is one GPU of the node: its index and UUID.
type GPURef struct {
	Index int
	UUID  string
}

// Directory turns user and group names into ids. Its errors say what is
// wrong without naming the file: "no user \"alice\" on this machine".
type Directory interface {
	LookupUser(name string) (uid uint32, err error)
	LookupGroup(name string) (gid uint32, err error)
}

// SystemDirectory is this machine's user database, through os/user: with
// cgo, the C library's (NSS: files, LDAP, SSSD, ...); built without cgo,
// /etc/passwd and /etc/group only.
type SystemDirectory struct{}

// LookupUser returns the uid of the user name.
func (SystemDirectory) LookupUser(name string) (uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return 0, fmt.Errorf("no user %q on this machine", name)
		}
		return 0, fmt.Errorf("looking up user %q: %w", name, err)
	}
	return parseID(u.Uid)
}

// LookupGroup returns the gid of the group name.
func (SystemDirectory) LookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		var unknown user.UnknownGroupError
		if errors.As(err, &unknown) {
			return 0, fmt.Errorf("no group %q on this machine", name)
		}
		return 0, fmt.Errorf("looking up group %q: %w", name, err)
	}
	return parseID(g.Gid)
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("the user database gave the id %q: %w", s, err)
	}
	return uint32(n), nil
}

// Resolve makes the file's rules for a node with the GPUs gpus, looking user
// and group names up in dir. The error, an *Error, is the problem on the
// earliest line: a GPU the node does not have, a user or group dir does not
// know.
func (f *File) Resolve(gpus []GPURef, dir Directory) (*Rules, error) {
	return f.resolve(gpus, true, dir)
}

// CheckNames looks the file's user and group names up in dir, for a check of
// the file away from the node it is for: what Resolve does but for the GPUs.
func (f *File) CheckNames(dir Directory) error {
	_, err := f.resolve(nil, false, dir)
	return err
}

func (f *File) resolve(gpus []GPURef, checkGPUs bool, dir Directory) (*Rules, error) {
	res := resolver{dir: dir, users: map[string]uint32{}, groups: map[string]uint32{}}
	r := &Rules{Weights: f.Weights}
	for _, ps := range f.Pools {
		p := Pool{Name: ps.Name, Everyone: ps.Everyone}
		for _, who := range ps.Users {
			id, ok := res.id(who)
			switch {
			case !ok:
			case who.Kind == User:
				p.UIDs = append(p.UIDs, id)
			default:
				p.GIDs = append(p.GIDs, id)
			}
		}
		if checkGPUs {
			for _, g := range ps.GPUs {
				if i, err := findGPU(g, gpus); err != nil {
					res.fail(g.Line, g.path, err)
				} else {
					p.GPUs = append(p.GPUs, i)
				}
			}
		}
		p.GPUs, p.UIDs, p.GIDs = sortedSet(p.GPUs), sortedSet(p.UIDs), sortedSet(p.GIDs)
		r.Pools = append(r.Pools, p)
	}
	slices.SortFunc(r.Pools, func(a, b Pool) int { return strings.Compare(a.Name, b.Name) })
	for _, q := range f.Quotas {
		id, _ := res.id(q.Who)
		r.Quotas = append(r.Quotas, Quota{Key: q.Who.String(), Kind: q.Who.Kind, ID: id, Limit: q.Limit})
	}
	if res.first != nil {
		return nil, res.first
	}
	if f.Profiles != nil {
		r.Profiles = make(map[string]map[string]time.Duration, len(f.Profiles))
		for task, times := range f.Profiles {
			r.Profiles[task] = maps.Clone(times)
		}
	}
	return r, nil
}

// resolver looks each name up once, and keeps the problem on the earliest
// line: entries are met pool by pool, not in the file's order.
type resolver struct {
	dir           Directory
	users, groups map[string]uint32
	first         *Error
}

// id is who's uid or gid; false when it could not be had (then fail was
// called). Everyone has none.
func (res *resolver) id(who Principal) (uint32, bool) {
	if who.Kind == Everyone {
		return 0, true
	}
	if who.ByID {
		return who.ID, true
	}
	known, lookup := res.users, res.dir.LookupUser
	if who.Kind == Group {
		known, lookup = res.groups, res.dir.LookupGroup
	}
	if id, ok := known[who.Name]; ok {
		return id, true
	}
	id, err := lookup(who.Name)
	if err != nil {
		res.fail(who.Line, who.path, err)
		return 0, false
	}
	known[who.Name] = id
	return id, true
}

func (res *resolver) fail(line int, path string, err error) {
	if res.first == nil || line < res.first.Line {
		res.first = &Error{Line: line, Msg: path + ": " + err.Error()}
	}
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
