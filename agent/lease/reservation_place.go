package lease

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// draw says where a lease's units come from when a reservation is involved:
// its owner drawing on it, or a share member borrowing from it (a
// preemptible lease). A nil draw is an ordinary lease.
type draw struct {
	res    *reservation
	borrow bool
	// share is the member a borrow counts toward.
	share string
}

func (d *draw) name() string {
	if d == nil {
		return ""
	}
	return d.res.Name
}

func (d *draw) borrowed() bool { return d != nil && d.borrow }

func (d *draw) member() string {
	if d == nil {
		return ""
	}
	return d.share
}

// placeLocked places a request that names a reservation: its owner's (or
// an admin's) draw, or a share member's borrow.
func (rs *Reservations) placeLocked(eng *placement.Engine, peer identity.Peer, req Request, pr placement.Request) (placement.Decision, *draw, bool, error) {
	if req.Reservation == "" {
		return placement.Decision{}, nil, false, nil
	}
	d, dr, err := rs.placeOnReservationLocked(eng, peer, req.Reservation, pr)
	return d, dr, true, err
}

// shortLocked lets a share member whose request is preemptible borrow,
// when ordinary units are short, from a reservation that lends it enough.
func (rs *Reservations) shortLocked(eng *placement.Engine, peer identity.Peer, req Request, pr placement.Request, short error) (placement.Decision, *draw, bool, error) {
	// Whole GPUs are never borrowed: a borrow takes units, not GPUs.
	if pr.GPUs > 0 || len(rs.byName) == rs.pending {
		return placement.Decision{}, nil, false, nil
	}
	d, dr := rs.borrowLocked(eng, peer, pr)
	switch {
	case dr == nil:
		return placement.Decision{}, nil, false, nil
	case !req.Preemptible:
		// Borrowing is the caller's choice: a borrowed lease may be ended
		// and its process killed by someone else's reservation, so nobody
		// is put in a share group's line of fire without asking.
		return placement.Decision{}, nil, true, fmt.Errorf("%w; reservation %q lends you units, which a lease that may be taken back gets: ask again with \"preemptible\":true (gpurun --preemptible)", short, dr.name())
	}
	return d, dr, true, nil
}

// placeOnReservationLocked places a request that names reservation name.
func (rs *Reservations) placeOnReservationLocked(eng *placement.Engine, peer identity.Peer, name string, pr placement.Request) (placement.Decision, *draw, error) {
	r, ok := rs.byName[name]
	if !ok {
		return placement.Decision{}, nil, errdefs.Errorf(errdefs.ErrNotFound, "reservation: no reservation named %q", name)
	}
	if peer.UID != r.owner.UID && !peer.Admin && peer.UID != 0 {
		i := reserve.MemberOf(r.Share, peer.UID, peer.GID, peer.Groups)
		if i < 0 {
			return placement.Decision{}, nil, errdefs.Errorf(errdefs.ErrPermission, "reservation %q: only its owner (uid %d), admins and its share group may lease on it", name, r.owner.UID)
		}
		d, err := rs.borrowFromLocked(eng, r, i, pr)
		if err != nil {
			return d, nil, err
		}
		return d, &draw{res: r, borrow: true, share: r.Share[i].Name}, nil
	}
	if !r.active {
		return placement.Decision{}, nil, errdefs.Errorf(errdefs.ErrNoCapacity, "reservation %q is pending: its units are not set aside yet", name)
	}
	d, err := eng.Place(rs.reservationNodeLocked(r, pr.Units), pr)
	if err != nil {
		u := rs.usageLocked(r)
		return d, nil, fmt.Errorf("reservation %q has %d idle unit(s) of %d (in use %d, lent %d): %w", name, u.idle, len(r.slots), u.inUse, u.lent, err)
	}
	return d, &draw{res: r}, nil
}

// borrowLocked looks for a reservation that lends peer enough: those that
// list peer in their share group, the lowest priority first (it matters
// least), then by name.
func (rs *Reservations) borrowLocked(eng *placement.Engine, peer identity.Peer, pr placement.Request) (placement.Decision, *draw) {
	type lender struct {
		r *reservation
		i int
	}
	var lenders []lender
	for _, r := range rs.byName {
		if !r.active {
			continue
		}
		if i := reserve.MemberOf(r.Share, peer.UID, peer.GID, peer.Groups); i >= 0 {
			lenders = append(lenders, lender{r, i})
		}
	}
	slices.SortFunc(lenders, func(a, b lender) int {
		if c := cmp.Compare(a.r.Priority, b.r.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.r.Name, b.r.Name)
	})
	for _, l := range lenders {
		if d, err := rs.borrowFromLocked(eng, l.r, l.i, pr); err == nil {
			return d, &draw{res: l.r, borrow: true, share: l.r.Share[l.i].Name}
		}
	}
	return placement.Decision{}, nil
}

// borrowFromLocked places a borrow of share member i on r's idle units,
// within what r lends this stage and the member's share of it.
func (rs *Reservations) borrowFromLocked(eng *placement.Engine, r *reservation, i int, pr placement.Request) (placement.Decision, error) {
	if !r.active {
		return placement.Decision{}, errdefs.Errorf(errdefs.ErrNoCapacity, "reservation %q is pending: it has nothing to lend yet", r.Name)
	}
	u := rs.usageLocked(r)
	lendable := reserve.Lendable(len(r.slots), r.need())
	room := min(reserve.Caps(lendable, r.Share)[i]-u.lentTo[i], lendable-u.lent)
	if room < pr.Units {
		return placement.Decision{}, errdefs.Errorf(errdefs.ErrNoCapacity, "reservation %q lends %s %d more unit(s) this stage (lendable %d, lent %d, %d of them to %s)",
			r.Name, r.Share[i].Name, max(room, 0), lendable, u.lent, u.lentTo[i], r.Share[i].Name)
	}
	d, err := eng.Place(rs.reservationNodeLocked(r, pr.Units), pr)
	if err != nil {
		return d, fmt.Errorf("borrowing from reservation %q: %w", r.Name, err)
	}
	return d, nil
}

// reservationNodeLocked is the placement view of r's idle units, for a
// request of units: the node as it is, each instance's free units replaced
// by r's idle ones there. Its units are for its owner's draws and its
// borrowers alike, so its owner does not count as its instances' user for
// holding them.
func (rs *Reservations) reservationNodeLocked(r *reservation, units int) *placement.Node {
	owner := r.owner.UID
	return rs.restrictedNodeLocked(func(add func(g, u int)) {
		for _, ref := range r.slots {
			if rs.t.gpus[ref.g].slots[ref.u].state == slotReserved {
				add(ref.g, ref.u)
			}
		}
	}, &owner, units)
}

// restrictedNodeLocked is the node's placement view with the free units of
// every instance replaced by those each adds, in ascending order per
// instance; instances' users leave out the uid except (see placementGPU).
// A GPU's free memory gains what up to units of the reserved units added
// there hold: a request of units takes that many, and their memory with
// them, while the others keep theirs.
// It reuses one scratch view: a decision must be done with it before the
// next call.
func (rs *Reservations) restrictedNodeLocked(each func(add func(g, u int)), except *uint32, units int) *placement.Node {
	base := rs.t.pub.nodeLocked()
	sc := &rs.scratch
	sc.Draining, sc.OneUserPerInstance, sc.ClientsPerInstance = base.Draining, base.OneUserPerInstance, base.ClientsPerInstance
	if len(sc.GPUs) != len(rs.t.gpus) {
		sc.GPUs = make([]placement.GPU, len(rs.t.gpus))
	}
	k := rs.t.cfg.Model.InstancesPerGPU
	if len(rs.scratchFree) != len(rs.t.gpus)*k {
		rs.scratchFree = make([][]int, len(rs.t.gpus)*k)
	}
	for gi, g := range rs.t.gpus {
		rs.t.pub.placementGPU(&sc.GPUs[gi], g, gpuCondition(rs.t.nodeCond, gi), except)
	}
	for i := range rs.scratchFree {
		rs.scratchFree[i] = rs.scratchFree[i][:0]
	}
	each(func(g, u int) {
		i := g*k + rs.t.cfg.Model.InstanceOf(u)
		rs.scratchFree[i] = append(rs.scratchFree[i], u)
	})
	for gi := range sc.GPUs {
		pg, g := &sc.GPUs[gi], rs.t.gpus[gi]
		pg.Free = 0
		reserved := 0
		for ki := range pg.Instances {
			pg.Instances[ki].FreeUnits = rs.scratchFree[gi*k+ki]
			pg.Free += len(pg.Instances[ki].FreeUnits)
			for _, u := range pg.Instances[ki].FreeUnits {
				if g.slots[u].state == slotReserved {
					reserved++
				}
			}
		}
		pg.MemoryFreeMiB = memoryFreeMiB(g, gpuCondition(rs.t.nodeCond, gi), unitsHeldMiB(min(reserved, units), rs.t.cfg.Model.UnitsPerGPU, g.dev.MemoryTotalMiB))
	}
	return sc
}
