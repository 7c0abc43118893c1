package lease

// Advancing a reservation's stages and taking lent units back from their
// borrowers (docs/design.md §1.6): SIGTERM through the pidfd, SIGKILL after the grace.

import (
	"cmp"
	"log/slog"
	"slices"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Advance starts the next stage of reservation name for peer (its owner or
// an admin). When the stage needs more than the reservation has unlent, lent
// units are taken back, split between share members by weight (the first
// listed first without weights): a borrower bound to a process gets SIGTERM
// and, after the reclaim grace, SIGKILL, and its units come back when it
// exits; any other borrower's lease ends at once. Advancing past the last
// stage ends the reservation.
func (rs *Reservations) Advance(peer identity.Peer, name string) (api.Reservation, error) {
	if !rs.t.lockOpen() {
		return api.Reservation{}, errStopping
	}
	defer rs.t.unlock()
	r, err := rs.managedLocked(peer, name, "advance")
	if err != nil {
		return api.Reservation{}, err
	}
	if !r.active {
		return api.Reservation{}, errdefs.Errorf(errdefs.ErrNoCapacity, "reservation %q is pending: its units are not set aside yet, so no stage runs", name)
	}
	if r.stage+1 == len(r.Needs) {
		v := rs.reservationViewLocked(r)
		if err := rs.endReservationLocked(r, "ended after its last stage"); err != nil {
			return api.Reservation{}, err
		}
		v.State, v.Stage, v.Need, v.InUse, v.Lendable, v.Reserved, v.Units = api.ReservationEnded, len(r.Needs), 0, 0, 0, 0, nil
		return v, nil
	}
	u := rs.usageLocked(r)
	k := reserve.ToReclaim(len(r.slots), r.Needs[r.stage+1], u.lent-u.reclaiming)
	victims := rs.victimsLocked(r, reserve.Reclaim(k, u.keep, r.Share))
	taken := 0
	for _, l := range victims {
		taken += len(l.Units)
	}
	wasStage, wasReclaimed, wasReclaiming := r.stage, r.reclaimed, r.reclaiming
	killAt := rs.t.clock.Now().UTC().Add(rs.t.cfg.ReclaimGrace)
	r.stage++
	r.reclaimed = taken
	r.reclaiming = map[string]time.Time{}
	for id, at := range wasReclaiming {
		if _, live := rs.t.leases[id]; live {
			r.reclaiming[id] = at
		}
	}
	for _, l := range victims {
		if _, ok := l.bind.(*pidBinding); ok {
			r.reclaiming[l.ID] = killAt
		}
	}
	if err := rs.saveReservationsLocked(); err != nil {
		r.stage, r.reclaimed, r.reclaiming = wasStage, wasReclaimed, wasReclaiming
		return api.Reservation{}, unsaved("the stage is not advanced", err)
	}
	rs.t.dirty = true
	rs.t.infoLocked("reservation advanced", slog.String("reservation", r.Name), slog.Int("stage", r.stage),
		slog.Int("need", r.need()), slog.Int("reclaimed", taken))
	for _, l := range victims {
		rs.reclaimLocked(r, l, killAt)
	}
	rs.t.serveWaitersLocked()
	return rs.reservationViewLocked(r), nil
}

// victimsLocked picks the borrowed leases to take back: per share member,
// its newest first, until plan[i] units.
func (rs *Reservations) victimsLocked(r *reservation, plan []int) []*lease {
	byMember := make([][]*lease, len(r.Share))
	seen := map[*lease]bool{}
	for _, ref := range r.slots {
		s := &rs.t.gpus[ref.g].slots[ref.u]
		if s.state != slotLeased {
			continue
		}
		l := s.lease
		if !l.Preemptible || l.Reservation != r.Name || l.reclaiming || seen[l] {
			continue
		}
		seen[l] = true
		if i := r.memberIndex(l.share); i >= 0 {
			byMember[i] = append(byMember[i], l)
		}
	}
	var out []*lease
	for i, ls := range byMember {
		slices.SortFunc(ls, func(a, b *lease) int {
			if c := b.Created.Compare(a.Created); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
		taken := 0
		for _, l := range ls {
			if taken >= plan[i] {
				break
			}
			out = append(out, l)
			taken += len(l.Units)
		}
	}
	return out
}

// reclaimLocked takes borrowed lease l back for r: a process-bound lease's
// holder gets SIGTERM now (SIGKILL when killAt has passed) and SIGKILL at
// killAt, through its pidfd, and the lease ends when it exits; any other
// lease ends now, and so does one whose holder its owner may not signal.
func (rs *Reservations) reclaimLocked(r *reservation, l *lease, killAt time.Time) {
	pb, ok := rs.signalledLocked(l)
	if !ok {
		rs.t.dropAndRecordLocked(l, "reclaimed for reservation "+r.Name, true)
		return
	}
	if !l.reclaiming {
		l.reclaiming = true
		rs.t.touchLocked(l.GPU.Index)
	}
	sig := syscall.SIGTERM
	if !rs.t.clock.Now().Before(killAt) {
		sig = syscall.SIGKILL
	}
	if err := pb.proc.Signal(sig); err != nil {
		rs.t.log.Warn("cannot signal a reclaimed borrower", "lease", l.ID, "pid", pb.pid, "signal", sig, "err", err)
	}
	if rs.t.lines.due() {
		rs.t.infoLocked("borrowed lease reclaimed", slog.String("lease", l.ID), slog.String("reservation", r.Name),
			slog.Int("pid", pb.pid), slog.String("signal", sig.String()), slog.Time("kill_at", killAt))
	}
	if sig == syscall.SIGTERM {
		id := l.ID
		rs.t.clock.AfterFunc(killAt.Sub(rs.t.clock.Now()), func() { rs.killReclaimed(id) })
	}
}

// signalledLocked returns the binding of a borrowed lease whose holder a
// reclaim ends by signals: a process of the lease's owner's (its real uid),
// or any for a lease of root's. An admin who is not root may bind a lease to
// anyone's process; gpuletd runs as root and must not signal, on the
// owner's behalf, a process the owner could not signal itself: such a lease
// just ends, as a time-bound one does.
func (rs *Reservations) signalledLocked(l *lease) (*pidBinding, bool) {
	pb, ok := l.bind.(*pidBinding)
	if !ok || l.Owner.UID == 0 {
		return pb, ok
	}
	uid, err := pb.proc.Owner()
	if err != nil || uid != l.Owner.UID {
		if err == nil {
			if rs.t.lines.due() {
				rs.t.infoLocked("borrowed lease reclaimed without a signal: its process is not its owner's", slog.String("lease", l.ID),
					slog.Int("pid", pb.pid), slog.Uint64("owner", uint64(l.Owner.UID)), slog.Uint64("process_uid", uint64(uid)))
			}
		}
		return nil, false
	}
	return pb, true
}

// killReclaimed sends SIGKILL to the holder of reclaimed lease id if it still
// runs after its grace.
func (rs *Reservations) killReclaimed(id string) {
	if !rs.t.lockOpen() {
		return
	}
	defer rs.t.unlock()
	l, ok := rs.t.leases[id]
	if !ok || !l.reclaiming {
		return
	}
	pb, ok := rs.signalledLocked(l)
	if !ok {
		// Its holder is another's by now (it took another uid): it ends
		// without the signal.
		rs.t.dropAndRecordLocked(l, "reclaimed", true)
		return
	}
	if err := pb.proc.Signal(syscall.SIGKILL); err != nil {
		rs.t.log.Warn("cannot kill a reclaimed borrower", "lease", id, "pid", pb.pid, "err", err)
	}
	if rs.t.lines.due() {
		rs.t.infoLocked("reclaimed borrower killed after its grace", slog.String("lease", id), slog.Int("pid", pb.pid))
	}
}
