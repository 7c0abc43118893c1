package lease

import (
	"log/slog"

	"github.com/gpulet/gpulet/agent/journal"
	accounting "github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// end ends lease id for reason; unknown ids are ignored.
func (m *Manager) end(id, reason string) {
	if !m.lockOpen() {
		return
	}
	if l, ok := m.leases[id]; ok {
		m.dropAndRecordLocked(l, reason, true)
	}
	m.unlock()
}

// Release ends lease id for peer.
func (m *Manager) Release(peer identity.Peer, id string) error {
	if !m.lockOpen() {
		return errStopping
	}
	defer m.unlock()
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		return errdefs.Errorf(errdefs.ErrNotFound, "no lease %q", id)
	}
	if err := m.dropAndRecordLocked(l, "released", false); err != nil {
		return unrecorded("the lease is not released and stays", err)
	}
	return nil
}

// Renew extends a time-bound lease by its ttl from now.
func (m *Manager) Renew(peer identity.Peer, id string) (api.Lease, error) {
	if !m.lockOpen() {
		return api.Lease{}, errStopping
	}
	defer m.unlock()
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrNotFound, "no lease %q", id)
	}
	b, ok := l.bind.(*ttlBinding)
	if !ok && l.Slurm != nil {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrInvalid, "lease %s is bound to Slurm job %d, not to a ttl: it needs no renewal", id, l.Slurm.JobID)
	}
	if !ok && l.Binding == string(KindPod) {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrInvalid, "lease %s is bound to a Kubernetes pod, not to a ttl: it needs no renewal", id)
	}
	if !ok && l.Claim != nil {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrInvalid, "lease %s is bound to Kubernetes ResourceClaim %s/%s, not to a ttl: it needs no renewal", id, l.Claim.Namespace, l.Claim.Name)
	}
	if !ok {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrInvalid, "lease %s is bound to process %d, not to a ttl: it needs no renewal", id, l.Owner.PID)
	}
	now := m.clock.Now().UTC()
	if !now.Before(b.deadline) {
		// Its deadline passed, and its timer has not ended it yet (it is
		// late, or waits for the lock held here): it ended then, and is not
		// brought back.
		m.dropAndRecordLocked(l, "ttl expired", true)
		return api.Lease{}, errdefs.Errorf(errdefs.ErrNotFound, "no lease %q", id)
	}
	// The table first, then the record: a rewrite that the record makes due
	// writes the journal from the table, which must hold the new deadline.
	was, wasLease := b.deadline, l.Lease
	exp := now.Add(b.ttl)
	b.deadline = exp
	l.change(func(pub *api.Lease) { pub.Expires = &exp })
	if err := m.rec.recordLocked(journal.Record{Op: journal.OpRenew, ID: l.ID, Deadline: &exp}); err != nil {
		b.deadline, l.Lease = was, wasLease
		return api.Lease{}, unrecorded("the lease is not renewed", err)
	}
	for _, g := range gpusOf(l.Lease) {
		m.touchLocked(g)
	}
	b.armLocked(m, l)
	return *l.Lease, nil
}

// dropAndRecordLocked ends l for reason: it records the end, then drops the
// lease. When the end cannot be recorded, force (the holder exited, the ttl
// ran out) drops it anyway, and the failed journal is written anew from the
// table before it takes another record; a restart meanwhile replays the grant
// and finds the holder gone or the deadline passed. Without force the lease
// is kept and the error returned.
func (m *Manager) dropAndRecordLocked(l *lease, reason string, force bool) error {
	// Out of the table first: a rewrite due after this record must not hold it.
	delete(m.leases, l.ID)
	peak, measured := measuredPeak(m.cfg.Usage, l.ID)
	if err := m.rec.recordLocked(journal.Record{Op: journal.OpEnd, ID: l.ID, PeakMemoryMiB: peak}); err != nil {
		if !force {
			m.leases[l.ID] = l
			return err
		}
		m.log.Error("cannot record the end of a lease; it ends anyway", "lease", l.ID, "reason", reason, "err", err)
	}
	m.dropLocked(l)
	m.ended++
	if m.lines.due() {
		if measured {
			m.infoLocked("lease ended", slog.String("lease", l.ID), slog.String("reason", reason), slog.Uint64("peak_memory_mib", peak))
		} else {
			m.infoLocked("lease ended", slog.String("lease", l.ID), slog.String("reason", reason))
		}
	}
	m.serveWaitersLocked()
	return nil
}

// measuredPeak is the peak memory the accountant (nil: off) measured for
// lease id, if it did.
func measuredPeak(usage *accounting.Accountant, id string) (uint64, bool) {
	if usage == nil {
		return 0, false
	}
	return usage.Peak(id)
}

// dropLocked removes a lease from the table and the ledger and lets go of its
// binding.
func (m *Manager) dropLocked(l *lease) {
	delete(m.leases, l.ID)
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			if s := &m.gpus[g].slots[u]; s.lease == l {
				s.vacate()
			}
		}
		m.touchLocked(g)
	}
	m.quotaUse.add(l.Owner.UID, identity.GroupsOf(l.Owner.GID, l.Owner.Groups), -unitsHeld(l.Lease))
	if l.holder != nil {
		if m.held[*l.holder] -= len(l.Units); m.held[*l.holder] <= 0 {
			delete(m.held, *l.holder)
		}
	}
	m.fifos.removeLeaseLocked(l)
	if l.bind != nil {
		l.bind.release()
	}
}
