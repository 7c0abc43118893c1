package lease

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/statefile"
)

// Reservations live in the state dir, in one file written whole (temp file,
// fsync, rename, fsync of the folder) before a change is answered: they
// survive a reboot, unlike leases. The leases that draw on a reservation or
// borrow from it are in the lease journal, with their reservation's name and
// share member, so a daemon restart finds which units each borrower holds;
// the file names the borrowers being taken back, so that a restart finishes
// their reclaim. A change whose record cannot be written is not made.

// recordsLocked is what the file keeps of the reservations, by name.
func (rs *Reservations) recordsLocked() []reserve.Record {
	out := make([]reserve.Record, 0, len(rs.byName))
	for _, r := range rs.byName {
		rec := reserve.Record{
			// r.groups is the owner's primary group, then the others.
			Name: r.Name, UID: r.owner.UID, GID: r.owner.GID, Groups: r.groups[1:], Created: r.created, Needs: r.Needs,
			Priority: r.Priority, Share: r.Share, Active: r.active, Stage: r.stage, Reclaimed: r.reclaimed,
		}
		if r.active {
			for _, ref := range r.slots {
				uuid := rs.t.gpus[ref.g].dev.UUID
				if n := len(rec.Units); n == 0 || rec.Units[n-1].UUID != uuid {
					rec.Units = append(rec.Units, reserve.GPUUnits{UUID: uuid})
				}
				last := &rec.Units[len(rec.Units)-1]
				last.Units = append(last.Units, ref.u)
			}
			// Only the borrowers still there: the others have exited.
			for id, at := range r.reclaiming {
				if _, live := rs.t.leases[id]; live {
					rec.Reclaiming = append(rec.Reclaiming, reserve.Reclaiming{Lease: id, KillAt: at})
				}
			}
			slices.SortFunc(rec.Reclaiming, func(a, b reserve.Reclaiming) int { return cmp.Compare(a.Lease, b.Lease) })
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b reserve.Record) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// saveReservationsLocked writes the reservations file from the table.
func (rs *Reservations) saveReservationsLocked() error {
	if rs.unread != nil {
		return rs.unread
	}
	if rs.t.cfg.ReservationsPath == "" {
		return nil
	}
	if err := reserve.Save(rs.t.cfg.ReservationsPath, rs.recordsLocked()); err != nil {
		if rs.failed == nil {
			rs.t.log.Error("cannot write the reservations file: no reservation is made, advanced or ended, and none pending is admitted, until it can be written", "path", rs.t.cfg.ReservationsPath, "err", err)
		}
		rs.failed = err
		return err
	}
	if rs.failed != nil {
		rs.t.log.Info("reservations file written again", "path", rs.t.cfg.ReservationsPath)
		rs.failed = nil
	}
	return nil
}

// tickLocked writes the reservations file again when it could
// not be written (Tick, every sample interval); then the pending
// reservations get their turn.
func (rs *Reservations) tickLocked() {
	if rs.failed == nil || rs.saveReservationsLocked() != nil {
		return
	}
	rs.t.serveWaitersLocked()
}

// restoreLocked takes back the reservations of the file: their
// units, where their workflows stand, and the reclaims under way. It runs at
// start, after the journal's leases are back and before the ledger is
// scanned. A damaged file is set aside, not written over; a record that
// cannot be used is named and its units go back to the node.
func (rs *Reservations) restoreLocked() {
	rs.byName = map[string]*reservation{}
	path := rs.t.cfg.ReservationsPath
	if path == "" {
		return
	}
	loaded, err := reserve.Load(path)
	switch {
	case errors.Is(err, reserve.ErrDamaged):
		rs.setAsideLocked(path, err, "gpuletd starts without reservations")
		return
	case err != nil:
		rs.unread = fmt.Errorf("the reservations file %s could not be read at start (%v); it is kept as it is until gpuletd starts again", path, err)
		rs.t.log.Error("cannot read the reservations file: no reservation is made, advanced or ended until gpuletd starts again and can read it", "path", path, "err", err)
		return
	}
	if len(loaded.Skipped) > 0 {
		for _, why := range loaded.Skipped {
			rs.t.log.Error("reservation record skipped", "path", path, "why", why)
		}
		// The next write would lose the skipped records: keep the file.
		rs.setAsideLocked(path, nil, "the reservations it could read are kept")
		if rs.unread != nil {
			return
		}
	}
	byUUID := map[string]int{}
	for gi, g := range rs.t.gpus {
		byUUID[g.dev.UUID] = gi
	}
	// The file lists them by name; seq orders pending ones of one priority
	// by age, as they were before the restart.
	slices.SortStableFunc(loaded.Records, func(a, b reserve.Record) int { return a.Created.Compare(b.Created) })
	for _, rec := range loaded.Records {
		rs.restoreReservationLocked(rec, byUUID)
	}
	// Reclaims go on once every reservation has its units back.
	for _, r := range rs.byName {
		for id, at := range r.reclaiming {
			rs.resumeReclaimLocked(r, id, at)
		}
	}
	if len(loaded.Skipped) > 0 {
		rs.saveReservationsLocked()
	}
}

// resumeReclaimLocked goes on taking back borrowed lease id for r after a
// restart. Its holder, if the journal's lease was taken back, is the very
// process that borrowed (its pidfd was opened against the recorded start
// time), so the signal cannot reach a process that reused its pid; one that
// exited meanwhile is not signalled at all.
func (rs *Reservations) resumeReclaimLocked(r *reservation, id string, killAt time.Time) {
	l, ok := rs.t.leases[id]
	if !ok || l.Reservation != r.Name || !l.Preemptible {
		delete(r.reclaiming, id)
		return
	}
	if _, ok := rs.signalledLocked(l); !ok {
		// The journal is written anew from the table after restore.
		rs.t.dropLocked(l)
		rs.t.ended++
		delete(r.reclaiming, id)
		rs.t.log.Info("borrowed lease reclaimed: it ends now", "lease", id, "reservation", r.Name)
		return
	}
	rs.reclaimLocked(r, l, killAt)
}

// setAsideLocked moves the reservations file aside so that nothing writes
// over it. damage is why it cannot be used whole (nil: some records could
// not be used).
func (rs *Reservations) setAsideLocked(path string, damage error, then string) {
	aside, err := statefile.SetAside(path)
	if err != nil {
		rs.unread = fmt.Errorf("the reservations file %s could not be used nor set aside (%v); it is kept as it is until gpuletd starts again", path, err)
		rs.t.log.Error("cannot set the reservations file aside: no reservation is made, advanced or ended until gpuletd starts again", "path", path, "err", err)
		return
	}
	if damage != nil {
		rs.t.log.Error("reservations file damaged: set aside for a look; "+then, "path", path, "set_aside", aside, "err", damage)
		return
	}
	rs.t.log.Error("reservations file set aside for a look at the records skipped; "+then, "path", path, "set_aside", aside)
}

// restoreReservationLocked takes back one reservation of the file.
func (rs *Reservations) restoreReservationLocked(rec reserve.Record, byUUID map[string]int) {
	rs.seq++
	r := &reservation{
		Spec:  reserve.Spec{Name: rec.Name, Needs: rec.Needs, Priority: rec.Priority, Share: rec.Share},
		owner: api.ReservationOwner{UID: rec.UID, GID: rec.GID}, created: rec.Created, seq: rs.seq,
		groups: identity.GroupsOf(rec.GID, rec.Groups), admin: rec.UID == 0,
		active: rec.Active, stage: rec.Stage, reclaimed: rec.Reclaimed, reclaiming: map[string]time.Time{},
	}
	rs.byName[r.Name] = r
	if !r.active {
		rs.pending++
		rs.t.log.Info("reservation kept across daemon restart, pending", "reservation", r.Name)
		return
	}
	lost := 0
	for _, gu := range rec.Units {
		gi, ok := byUUID[gu.UUID]
		if !ok {
			lost += len(gu.Units)
			continue
		}
		for _, u := range gu.Units {
			if u >= rs.t.cfg.Model.UnitsPerGPU {
				lost++
				continue
			}
			s := &rs.t.gpus[gi].slots[u]
			if s.res != nil {
				lost++
				continue
			}
			s.res = r
			if s.state == slotFree {
				s.state = slotReserved
			}
			r.slots = append(r.slots, slotRef{gi, u})
			rs.t.touchLocked(gi)
		}
	}
	slices.SortFunc(r.slots, slotRef.compare)
	if lost > 0 {
		rs.t.log.Warn("reservation kept across daemon restart with fewer units: some of its units are not on this node any more (a GPU gone, fewer units per GPU)",
			"reservation", r.Name, "units", len(r.slots), "lost", lost)
	} else {
		rs.t.log.Info("reservation kept across daemon restart", "reservation", r.Name, "stage", r.stage, "units", len(r.slots))
	}
	for _, rc := range rec.Reclaiming {
		r.reclaiming[rc.Lease] = rc.KillAt
	}
}
