package placement

import (
	"slices"
	"strings"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Pool is a named group of the node's GPUs and who may lease from them
// (docs/design.md §1.7). The config file's pools section is mapped onto it;
// placement owns the type so that it, and the collector and replay that share
// it, need no config parser.
type Pool struct {
	Name string
	GPUs []int // indices, sorted, each once
	// Set is whom it is open to: everyone when the file gave no users;
	// otherwise the uids UIDs and the members of the groups GIDs. Admins
	// may lease from every pool.
	identity.Set
}

// Allows says whether a caller with uid and groups gids (its primary group
// and its supplementary ones) may lease from the pool, by identity's rule;
// no pool (nil) allows no one. Admins may lease from every pool; that is for
// the caller to know.
func (p *Pool) Allows(uid uint32, gids []uint32) bool {
	return p != nil && p.Set.Allows(uid, gids)
}

// pools is an engine's pools, indexed for decisions.
type pools struct {
	list []Pool
	// of lists, per GPU index, the positions in list of the pools it is in;
	// names names them, for a refusal, made once so that a decision makes
	// no words.
	of    [][]int
	names []string
	// allowed says who may use which pool, by identity's rule.
	allowed identity.Index
}

// WithPools returns a copy of e that places by the pools ps (docs/design.md §1.7
// and §11; nil: none, every GPU open to everyone).
func (e *Engine) WithPools(ps []Pool) *Engine {
	c := *e
	c.pools = pools{list: ps}
	for pi, p := range ps {
		for _, g := range p.GPUs {
			for len(c.pools.of) <= g {
				c.pools.of = append(c.pools.of, nil)
			}
			c.pools.of[g] = append(c.pools.of[g], pi)
		}
	}
	sets := make([]*identity.Set, len(ps))
	for pi := range ps {
		sets[pi] = &ps[pi].Set
	}
	c.pools.allowed = identity.NewIndex(sets)
	c.pools.names = make([]string, len(c.pools.of))
	for g, in := range c.pools.of {
		names := make([]string, len(in))
		for i, pi := range in {
			names[i] = ps[pi].Name
		}
		c.pools.names[g] = strings.Join(names, ", ")
	}
	return &c
}

// Open reports whether the engine has no pools: every GPU open to everyone.
func (e *Engine) Open() bool { return len(e.pools.list) == 0 }

// access is what one decision may use: which pools, and how full each is.
type access struct {
	// named is the pool the request names (-1: none).
	named int
	// allowed marks, per pool, whether the caller may use it.
	allowed []bool
	// free is, per pool, its free units; open is that of the GPUs in no pool.
	free []int
	open int
}

// accessFor resolves the request's pool and the pools its caller may use. It
// returns nil when the engine has no pools: every GPU is open then.
func (e *Engine) accessFor(n *Node, r Request) (*access, error) {
	if len(e.pools.list) == 0 {
		if r.Pool != "" {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "pool: no pool named %q (no pools are configured)", r.Pool)
		}
		return nil, nil
	}
	a := &access{named: -1, allowed: make([]bool, len(e.pools.list)), free: make([]int, len(e.pools.list))}
	if r.Pool != "" {
		i := slices.IndexFunc(e.pools.list, func(p Pool) bool { return p.Name == r.Pool })
		if i < 0 {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "pool: no pool named %q (pools: %s)", r.Pool, e.poolNames())
		}
		if !r.Admin && !e.pools.list[i].Allows(r.UID, r.GIDs) {
			return nil, errdefs.Errorf(errdefs.ErrPermission, "pool %s: %s may not lease there", r.Pool, identity.UserName(r.UID))
		}
		a.named, a.allowed[i] = i, true
	} else {
		e.pools.markAllowed(a.allowed, r)
	}
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		in := e.poolsOf(g.Index)
		if len(in) == 0 {
			a.open += g.Free
		}
		for _, pi := range in {
			a.free[pi] += g.Free
		}
	}
	return a, nil
}

// markAllowed marks in allowed the pools r's caller may use: all for an
// admin, else those open to all and those naming its uid or one of its groups.
func (ps *pools) markAllowed(allowed []bool, r Request) {
	if r.Admin {
		for i := range allowed {
			allowed[i] = true
		}
		return
	}
	ps.allowed.Mark(allowed, r.UID, r.GIDs)
}

func (e *Engine) poolsOf(gpu int) []int {
	if gpu < len(e.pools.of) {
		return e.pools.of[gpu]
	}
	return nil
}

func (e *Engine) poolNames() string {
	names := make([]string, len(e.pools.list))
	for i, p := range e.pools.list {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// gpuAccess says whether the decision may use GPU g and, when it may, the free
// units of the fullest pool through which it may: among pools that fit, the
// one left with the fewest free units wins (less fragmentation).
func (e *Engine) gpuAccess(a *access, g *GPU) (reason, int) {
	if a == nil {
		return reason{}, 0
	}
	in := e.poolsOf(g.Index)
	if a.named >= 0 {
		if !slices.Contains(in, a.named) {
			return reason{kind: notInPool, text: e.pools.list[a.named].Name}, 0
		}
		return reason{}, a.free[a.named]
	}
	if len(in) == 0 {
		return reason{}, a.open
	}
	best := -1
	for _, pi := range in {
		if a.allowed[pi] && (best < 0 || a.free[pi] < best) {
			best = a.free[pi]
		}
	}
	if best < 0 {
		return reason{kind: poolsForbidden, text: e.pools.names[g.Index]}, 0
	}
	return reason{}, best
}

// modelRank is where GPU model name stands in prefer (fastest first); models
// not in it come after every model in it.
func modelRank(prefer []string, name string) int {
	if i := slices.Index(prefer, name); i >= 0 {
		return i
	}
	return len(prefer)
}
