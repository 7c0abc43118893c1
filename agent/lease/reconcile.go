package lease

import (
	"context"
	"log/slog"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/placement"
)

// Watch starts watching the ledger for offline claims until ctx ends.
func (m *Manager) Watch(ctx context.Context) error {
	if err := m.cfg.Ledger.Watch(ctx, (*ledgerEvents)(m)); err != nil {
		return err
	}
	// Claims made between restore and the watch being in place are found here.
	m.Rescan()
	return nil
}

// ledgerEvents adapts the Manager to ledger.Handler without exporting the
// methods on Manager itself.
type ledgerEvents Manager

func (e *ledgerEvents) Units(events []ledger.UnitEvent) bool {
	m := (*Manager)(e)
	if !m.lockOpen() {
		return false
	}
	for _, ev := range events {
		s := &m.gpus[ev.GPU].slots[ev.Unit]
		if s.own > 0 {
			s.own--
			continue
		}
		// A leased unit's FIFO appearing, and a free unit's going, change
		// nothing either: skip the look at the file.
		switch {
		case s.state == slotLeased && !ev.Gone, (s.state == slotFree || s.state == slotReserved) && ev.Gone:
			continue
		}
		was := s.fifo
		m.applyLocked(ev.GPU, ev.Unit, m.cfg.Ledger.Present(ev.GPU, ev.Unit))
		if s.state == slotOffline && s.fifo != was {
			sweepIntruderLocked(m, ev.GPU, ev.Unit)
		}
	}
	changed := m.dirty
	if changed {
		m.serveWaitersLocked()
	}
	m.unlock()
	return changed
}

// sweepIntruderLocked removes a new offline claim on unit i of GPU g when,
// with MPS, its instance already serves another user who keeps it (by
// placement's rule): on real MPS the claimer's process would wait at its
// CUDA start until that user's clients end, and gpuletd would count a unit
// nobody can use. The claim is flagged in the log, with its owner, and its
// FIFO removed as junk is; the watch event of the removal frees the unit.
// gpurun --offline never makes such a claim: only one made by hand, or one
// that raced another user's first claim, is swept. Claims found at a rescan
// (a restart) are left alone: which of two came first is not known then.
func sweepIntruderLocked(m *Manager, g, i int) {
	if !m.cfg.MPS {
		return
	}
	s := &m.gpus[g].slots[i]
	k := m.cfg.Model.InstanceOf(i)
	others := placement.KeptBy(m.pub.nodeLocked(), g, k, s.uid)
	if len(others) == 0 {
		return
	}
	removed, err := m.cfg.Ledger.RemoveFIFO(g, i, s.fifo)
	if err != nil {
		m.claimLines.Log(slog.LevelWarn, "cannot remove an offline claim on an instance that serves another user", "gpu", g, "instance", k, "unit", i, "uid", s.uid, "err", err)
		return
	}
	if removed {
		m.claimLines.Log(slog.LevelWarn, "offline claim on an MPS instance that serves another user removed: its process would wait there until theirs end", "gpu", g, "instance", k, "unit", i, "uid", s.uid, "serves", others)
	}
}

func (e *ledgerEvents) Rescan() { (*Manager)(e).Rescan() }

// Rescan lists the whole ledger again.
func (m *Manager) Rescan() {
	if !m.lockOpen() {
		return
	}
	m.rescanLocked()
	m.unlock()
}

func (m *Manager) rescanLocked() {
	for gi, g := range m.gpus {
		present, err := m.cfg.Ledger.Scan(gi)
		if err != nil {
			m.log.Error("cannot list the pipe-file ledger", "gpu", gi, "err", err)
			continue
		}
		seen := make([]bool, len(g.slots))
		for _, i := range present {
			seen[i] = true
		}
		for i := range g.slots {
			g.slots[i].own = 0
			m.applyLocked(gi, i, seen[i])
		}
	}
	m.serveWaitersLocked()
}

// applyLocked brings unit i of GPU g in line with whether its FIFO is there.
func (m *Manager) applyLocked(g, i int, present bool) {
	s := &m.gpus[g].slots[i]
	switch {
	case (s.state == slotFree || s.state == slotReserved) && present:
		// A claimer may take a reserved unit too: the ledger cannot tell
		// claimers which units are set aside. It is the reservation's again
		// once the claim ends.
		s.state = slotOffline
		s.uid, s.fifo, _ = m.cfg.Ledger.Stat(g, i)
		m.quotaUse.add(s.uid, nil, 1)
		m.touchLocked(g)
	case s.state == slotOffline && present:
		// The FIFO may have been replaced by another claimer's (a remove and a
		// create coalesced): the probe must name the FIFO that is there now.
		if uid, id, ok := m.cfg.Ledger.Stat(g, i); ok && id != s.fifo {
			m.quotaUse.add(s.uid, nil, -1)
			m.quotaUse.add(uid, nil, 1)
			s.uid, s.fifo = uid, id
			m.touchLocked(g)
		}
	case (s.state == slotOffline || s.state == slotBlocked) && !present:
		if s.state == slotOffline {
			m.quotaUse.add(s.uid, nil, -1)
		}
		s.vacate()
		m.touchLocked(g)
	case s.state == slotBlocked && present:
		// The junk gave way to a claimer's FIFO.
		s.state = slotOffline
		s.uid, s.fifo, _ = m.cfg.Ledger.Stat(g, i)
		m.quotaUse.add(s.uid, nil, 1)
		m.touchLocked(g)
	case s.state == slotLeased && !present:
		// Someone removed a lease's pipe file; the lease still holds the unit,
		// so the file comes back and the count stays right.
		m.log.Warn("pipe file of a live lease was removed; recreating it", "lease", s.lease.ID, "gpu", g, "unit", i)
		if err := m.fifos.createLocked(g, i); err != nil && err != ledger.ErrTaken {
			m.log.Error("cannot recreate pipe file", "err", err)
		}
	}
}

// probeOffline removes offline claims whose FIFO nobody holds locked; Tick
// calls it every sample interval. The files are probed without the lock, so
// that leasing does not wait on a node with thousands of claims; each probe
// names the FIFO it expects, so a unit that changed hands meanwhile is left
// alone.
func (m *Manager) probeOffline() {
	type claim struct {
		g, i int
		fifo ledger.FileID
	}
	if !m.lockOpen() {
		return
	}
	var claims []claim
	for gi, g := range m.gpus {
		for i, s := range g.slots {
			if s.state == slotOffline {
				claims = append(claims, claim{gi, i, s.fifo})
			}
		}
	}
	m.unlock()
	var gone []claim
	for _, c := range claims {
		stale, err := m.cfg.Ledger.Probe(c.g, c.i, c.fifo)
		if err != nil {
			m.claimLines.Log(slog.LevelWarn, "cannot probe offline claim", "gpu", c.g, "unit", c.i, "err", err)
			continue
		}
		if stale {
			m.claimLines.Log(slog.LevelInfo, "offline claim ended: its pipe file is locked by no process (its claimer exited), so it was removed", "gpu", c.g, "unit", c.i)
			gone = append(gone, c)
		}
	}
	if len(gone) == 0 || !m.lockOpen() {
		return
	}
	for _, c := range gone {
		m.applyLocked(c.g, c.i, m.cfg.Ledger.Present(c.g, c.i))
	}
	m.serveWaitersLocked()
	m.unlock()
}
