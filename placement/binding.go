package placement

import (
	"cmp"
	"slices"
)

// With MPS an instance serves one user at a time, so a user with units on an
// instance keeps every other user off all of it: binding instances, not
// holding units, is what shuts others out. A user with one unit on each of
// four GPUs at one instance per GPU would hold 6% of the node's units and
// keep everyone else off all of it. So a user's holds bind only as many
// instances as their units could fill: the instances where they hold the
// most units, until those instances' sizes add up to the units they hold. On
// the others they hold units but keep nobody off (docs/design.md §5.3).

// Hold is the units one user holds on an instance through leases and
// offline claims.
type Hold struct {
	UID   uint32
	Units int
}

// Holding is one instance's size and holds, the input of Surplus.
type Holding struct {
	Size  int
	Holds []Hold
}

// Slot names an instance by its GPU's position and its index.
type Slot struct{ GPU, Instance int }

// Surplus returns, for each instance of gpus (by GPU position, then
// instance), the users whose holds there keep nobody off: each user keeps
// the instances where they hold the most units (ties: the lower GPU, then
// instance), one after another until the kept instances' sizes reach the
// units the user holds on the node; the rest of their holds are surplus.
// A user who binds an instance without holding units on it (an MPS client
// run without a lease, a reservation's owner) is no holder: such bindings
// are not Surplus's to judge. It returns nil when nothing is surplus.
func Surplus(gpus [][]Holding) map[Slot][]uint32 {
	var a surplusAcc
	for g, ins := range gpus {
		for k, h := range ins {
			a.add(Slot{g, k}, h.Size, h.Holds)
		}
	}
	return a.result()
}

// nodeSurplus is Surplus of n's instances.
func nodeSurplus(n *Node) map[Slot][]uint32 {
	var a surplusAcc
	for g := range n.GPUs {
		for k := range n.GPUs[g].Instances {
			in := &n.GPUs[g].Instances[k]
			a.add(Slot{g, k}, in.Size, in.Holds)
		}
	}
	return a.result()
}

// surplusAcc gathers each user's holds, by user; it allocates nothing for
// instances that hold nothing.
type surplusAcc struct{ by map[uint32][]heldAt }

type heldAt struct {
	slot        Slot
	units, size int
}

func (a *surplusAcc) add(slot Slot, size int, holds []Hold) {
	for _, hd := range holds {
		if hd.Units <= 0 {
			continue
		}
		if a.by == nil {
			a.by = map[uint32][]heldAt{}
		}
		a.by[hd.UID] = append(a.by[hd.UID], heldAt{slot, hd.Units, size})
	}
}

func (a *surplusAcc) result() map[Slot][]uint32 {
	var out map[Slot][]uint32
	for uid, ats := range a.by {
		if len(ats) < 2 {
			continue // one instance is always kept
		}
		held := 0
		for _, h := range ats {
			held += h.units
		}
		slices.SortFunc(ats, func(a, b heldAt) int {
			return cmp.Or(cmp.Compare(b.units, a.units), cmp.Compare(a.slot.GPU, b.slot.GPU), cmp.Compare(a.slot.Instance, b.slot.Instance))
		})
		kept := 0
		for i, h := range ats {
			if i > 0 && kept >= held {
				if out == nil {
					out = map[Slot][]uint32{}
				}
				out[h.slot] = append(out[h.slot], uid)
				continue
			}
			kept += h.size
		}
	}
	for s := range out {
		slices.Sort(out[s])
	}
	return out
}

// binding is the one-user rule for one decision: which users keep others
// off which instance. It looks at the node's holds only when an instance
// serves another user, the rare case, and then once.
type binding struct {
	n       *Node
	done    bool
	surplus map[Slot][]uint32
}

// servesOthers reports whether instance k of the GPU at position g serves a
// user other than uid whose hold there keeps others off.
func (b *binding) servesOthers(g, k int, uid uint32) bool {
	in := &b.n.GPUs[g].Instances[k]
	if !ServesOthers(in.Users, uid) {
		return false
	}
	if !b.done {
		b.done = true
		b.surplus = nodeSurplus(b.n)
	}
	yield := b.surplus[Slot{g, k}]
	for _, u := range in.Users {
		if u != uid && !slices.Contains(yield, u) {
			return true
		}
	}
	return false
}

// KeptBy returns the users other than uid who keep instance k of the GPU at
// position g, with their holds or their live MPS server, ascending; none when
// uid may join it. Without MPS nobody keeps an instance.
func KeptBy(n *Node, g, k int, uid uint32) []uint32 {
	b := binding{n: n}
	if !n.OneUserPerInstance || !b.servesOthers(g, k, uid) {
		return nil
	}
	var out []uint32
	for _, u := range n.GPUs[g].Instances[k].Users {
		if u != uid && !slices.Contains(b.surplus[Slot{g, k}], u) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}
