package placement

import (
	"cmp"
	"slices"

	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/pipefile"
)

// Reachable is how many units r's caller could ever have set aside on n: the
// units of the instances of every GPU it may use that could take a one-unit
// lease of its, whatever their load. A reservation larger than that can never
// be admitted, so it must not wait.
func (e *Engine) Reachable(n *Node, r Request) (int, error) {
	acc, err := e.accessFor(n, r)
	if err != nil {
		return 0, err
	}
	one := r
	one.Units = 1
	total := 0
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		if why, _ := e.gpuAccess(acc, g); why.kind != fits || never(g, one).kind != fits {
			continue
		}
		for _, in := range g.Instances {
			total += in.Size
		}
	}
	return total, nil
}

// Reserve picks r.Units units for a workflow reservation (docs/design.md §1.6), which,
// unlike a lease, may span instances and GPUs: the units go to the instances
// where a one-unit lease of r's caller could go now (the GPU filters, the
// instance filters, one user per MPS server, and the pools r's caller may
// use: its owner's draws are placed through them), fullest of free units first,
// so that the reservation sits in as few instances as it can and its
// owner's leases, each on one instance, find their units together. Ties go
// by GPU, then instance.
//
// When fewer units than r.Units can be had, it returns every unit it could
// have taken with an errdefs.ErrNoCapacity error: a pending reservation
// holds those until there are enough.
func (e *Engine) Reserve(n *Node, r Request) ([]Choice, error) {
	if n.Draining {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "the node is draining: nothing new is set aside")
	}
	acc, err := e.accessFor(n, r)
	if err != nil {
		return nil, err
	}
	one := r
	one.Units = 1
	type candidate struct {
		gpu, instance int
		free          []int
	}
	var cands []candidate
	bind := &binding{n: n}
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		if why, _ := e.gpuAccess(acc, g); why.kind != fits || never(g, one).kind != fits || gpuNow(g, one).kind != fits {
			continue
		}
		for ki := range g.Instances {
			in := &g.Instances[ki]
			if instanceNow(n, bind, gi, ki, one).kind == fits {
				cands = append(cands, candidate{gi, ki, in.FreeUnits})
			}
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(len(b.free), len(a.free)) })
	var out []Choice
	left := r.Units
	// Units set aside hold their share of memory (docs/design.md §1.8): a
	// GPU gives no more units than its free memory holds the shares of.
	taken := make(map[int]int)
	for _, c := range cands {
		if left == 0 {
			break
		}
		g := &n.GPUs[c.gpu]
		take := min(left, len(c.free))
		for take > 0 && g.Units > 0 && pipefile.MemoryShareMiB(taken[c.gpu]+take, g.Units, g.MemoryTotalMiB) > g.MemoryFreeMiB {
			take--
		}
		if take == 0 {
			continue
		}
		taken[c.gpu] += take
		out = append(out, Choice{GPU: g.Index, Instance: g.Instances[c.instance].Index, Units: append([]int(nil), c.free[:take]...)})
		left -= take
	}
	if left > 0 {
		return out, errdefs.Errorf(errdefs.ErrNoCapacity, "only %d of the %d unit(s) can be set aside now", r.Units-left, r.Units)
	}
	return out, nil
}
