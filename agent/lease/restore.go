package lease

import (
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/gpulet/gpulet/agent/journal"
)

// restore takes back the journal's leases whose holder still lives or whose
// deadline has not passed, counts every other FIFO as an offline claim, and
// removes the claims nobody holds.
func (m *Manager) restore() {
	m.mu.Lock()
	defer m.unlock()
	var entries []journal.Entry
	b, err := os.ReadFile(m.cfg.JournalPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		m.log.Error("lease journal unreadable; rebuilding from the pipe-file ledger", "path", m.cfg.JournalPath, "err", err)
	default:
		entries = m.rec.replayLocked(b)
	}
	for _, e := range entries {
		// Its own copy: a pointer into entries would keep them all.
		pub := e.Lease
		l := newTableLease(&pub, nil, e.Share)
		bind, why := m.rebind(e)
		if bind == nil {
			m.log.Info(why, "lease", l.ID, "pid", l.Owner.PID)
			m.fifos.removeUnheldLocked(l)
			continue
		}
		l.bind = bind
		pub.Binding = string(bind.kind())
		pub.Env = m.sharedEnvLocked(&pub, pub.Env)
		if taken := m.fifos.recreateLocked(l); taken >= 0 {
			m.log.Warn("lease dropped: while the daemon was down its pipe file was removed and the unit claimed offline", "lease", l.ID, "unit", taken)
			bind.release()
			continue
		}
		m.addLocked(l)
		bind.armLocked(m, l)
		// Within the per-lease line budget, as grants are: thousands of
		// lines would hold up the start.
		if m.lines.due() {
			m.infoLocked("lease kept across daemon restart", slog.String("lease", l.ID), slog.Int("gpu", l.GPU.Index), slog.Any("units", l.Units))
		}
	}
	for _, f := range m.features {
		f.restoreLocked()
	}
	m.rescanLocked()
	if err := m.journal.Rewrite(m.rec.entriesLocked()); err != nil {
		m.log.Error("cannot write the lease journal: the old one is kept, and no lease is granted, released or renewed until it can be written", "err", err)
	}
}

// rebind binds a journaled lease again as its kind says, or says why it ended
// while the daemon was down.
func (m *Manager) rebind(e journal.Entry) (binding, string) {
	kind := Kind(e.Lease.Binding)
	if kind == "" {
		// Journals written before kinds were recorded.
		kind = KindPID
		if e.Deadline != nil {
			kind = KindTTL
		}
	}
	switch kind {
	case KindTTL:
		if e.Deadline == nil || !m.clock.Now().Before(*e.Deadline) {
			return nil, "lease expired while the daemon was down"
		}
		return newTTLBinding(time.Duration(e.TTLNanos), *e.Deadline), ""
	case KindPID:
		p, _, err := m.cfg.Processes.Open(e.Lease.Owner.PID, e.StartTime)
		if err != nil {
			return nil, "lease holder exited while the daemon was down"
		}
		return &pidBinding{proc: p, pid: e.Lease.Owner.PID, startTime: e.StartTime}, ""
	case KindSlurm:
		return rebindSlurm(e)
	case KindPod:
		// Whether its pod still runs is the kubelet's to say: the plugin
		// ends it once the pod-resources API no longer lists its devices.
		return podBinding{}, ""
	case KindClaim:
		// Whether its claim is still prepared is the kubelet's to say: it
		// unprepares it through the DRA driver, also after restarts.
		return claimBinding{}, ""
	}
	return nil, "lease of an unknown binding kind dropped"
}

func (m *Manager) shapes() []journal.GPUShape {
	out := make([]journal.GPUShape, len(m.gpus))
	for i, g := range m.gpus {
		out[i] = journal.GPUShape{UUID: g.dev.UUID, UnitsTotal: m.cfg.Model.UnitsPerGPU, InstanceOf: m.cfg.Model.InstanceOf, UnitsPerMax: m.cfg.Model.UnitsPerClient}
	}
	return out
}
