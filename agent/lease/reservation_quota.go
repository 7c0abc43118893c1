package lease

// This file bounds what a user can do with reservations beyond their count:
// the units they set aside count toward their quotas, and a priority above
// the configured ceiling needs an admin.

import (
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// SetPriorityCeiling sets the highest reservation priority a caller who is
// not an admin may ask (the config's reservations.max_user_priority). Until
// it is called the ceiling is 0, the default priority.
func (rs *Reservations) SetPriorityCeiling(p int) { rs.priorityCeiling.Store(int64(p)) }

// checkPriority refuses a priority above the ceiling from a caller who is
// not an admin: a high priority puts a reservation in front of everyone's.
func (rs *Reservations) checkPriority(peer identity.Peer, priority int) error {
	ceiling := rs.priorityCeiling.Load()
	if peer.Admin || peer.UID == 0 || int64(priority) <= ceiling {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrPermission, "priority: %d is above %d, the highest a user who is not an admin may ask (the config's reservations.max_user_priority)", priority, ceiling)
}

// reservedUseLocked counts, toward each reservation owner (its uid, the
// groups it had when it reserved, and everyone), the units its reservations
// set aside beyond those its own leases on them hold, which the held count
// has already: a reservation's size (its largest stage), pending ones
// included. A unit lent to a share member counts toward the owner, who set
// it aside, and toward the borrower, who holds it. It looks at the
// reservations' units only, never at every lease of the node: every
// lease's check and every published view counts it.
func (rs *Reservations) reservedUseLocked() *quotaUse {
	if len(rs.byName) == 0 {
		return nil
	}
	u := newQuotaUse()
	for _, r := range rs.byName {
		drawn := 0
		for _, ref := range r.slots {
			s := &rs.t.gpus[ref.g].slots[ref.u]
			if s.state == slotLeased && s.lease.share == "" && s.lease.Reservation == r.Name && s.lease.Owner.UID == r.owner.UID {
				drawn++
			}
		}
		if n := r.Size() - drawn; n > 0 {
			u.add(r.owner.UID, r.groups, n)
		}
	}
	return &u
}

// ownedLocked reports whether reservation name is uid's: a draw on it adds
// nothing to uid's quotas, which counted its units when it was made.
func (rs *Reservations) ownedLocked(name string, uid uint32) bool {
	r, ok := rs.byName[name]
	return ok && r.owner.UID == uid
}
