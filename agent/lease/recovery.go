package lease

import (
	"errors"
	"fmt"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/api"
)

// This file is what the Manager does when the journal cannot be written (a
// full run dir) or was found damaged: refuse what it could not record, say
// so, put the journal right once it can, and name what a replay lost.

// JournalError says why leases cannot be recorded now; nil when they can.
// While it is set the Manager grants, releases and renews nothing (those
// answer unavailable), and each Tick tries to write the journal anew.
// It reads the published view and takes no lock.
func (m *Manager) JournalError() error {
	if v := m.view.Load(); v != nil && v.Unrecorded != "" {
		return errors.New(v.Unrecorded)
	}
	return nil
}

// unrecordedLocked says why leases cannot be recorded, for the view; empty
// when they can.
func (m *Manager) unrecordedLocked() string {
	if m.journal.Failed() == nil {
		return ""
	}
	return fmt.Sprintf("cannot record leases (%v): no grants, releases or renewals until the lease journal can be written", m.journal.Failed())
}

// unrecorded is the answer to a change that was not made because it could
// not be recorded.
func unrecorded(what string, err error) error {
	return api.Errorf(api.ErrUnavailable, "the lease journal cannot be written, so %s: %v", what, err)
}

// repairJournalLocked writes a failed journal anew from the table, and once
// that works serves the waiting requests; it reports whether it repaired it.
func (m *Manager) repairJournalLocked() bool {
	if m.journal.Failed() == nil {
		return false
	}
	if m.journal.Rewrite(m.entriesLocked()) != nil {
		return false
	}
	m.log.Warn("lease journal written again: grants, releases and renewals resume", "leases", len(m.leases))
	m.dirty = true
	m.serveWaitersLocked()
	return true
}

// replayLocked decodes the journal b and logs every record it skipped and
// every lease it dropped, by name and why; it returns the leases to take back.
func (m *Manager) replayLocked(b []byte) []journal.Entry {
	rep, err := journal.Decode(b, m.shapes())
	if err != nil {
		m.log.Error("lease journal not replayed: rebuilding from the pipe-file ledger", "path", m.cfg.JournalPath, "err", err)
		return nil
	}
	for _, n := range rep.Skipped {
		attrs := []any{"line", n.Record, "why", n.Why}
		if n.Lease != "" {
			attrs = append(attrs, "names_lease", n.Lease)
		}
		m.log.Warn("lease journal record skipped; the records after it still count", attrs...)
	}
	if rep.SkippedMore > 0 {
		m.log.Warn("more lease journal records skipped than are listed", "not_listed", rep.SkippedMore)
	}
	for _, n := range rep.Dropped {
		m.log.Warn("lease dropped at replay", "lease", n.Lease, "line", n.Record, "why", n.Why)
	}
	return rep.Entries
}

// removeUnheldFIFOsLocked removes the FIFOs of a lease that restore drops,
// but not one an offline claimer holds: when the lease's end could not be
// recorded before a crash, its units may have been claimed since.
func (m *Manager) removeUnheldFIFOsLocked(l *lease) {
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			if m.cfg.Ledger.Held(g, u) {
				continue
			}
			if _, err := m.removeFIFOLocked(g, u); err != nil {
				m.log.Error("cannot remove pipe file", "lease", l.ID, "err", err)
			}
		}
	}
}
