package lease

import (
	"errors"
	"fmt"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// This file is what the Manager does when the journal cannot be written (a
// full run dir) or was found damaged: refuse what it could not record, say
// so, put the journal right once it can, and name what a replay lost.

// JournalError says why leases cannot be recorded now; nil when they can.
// While it is set the Manager grants and renews nothing (those
// answer unavailable; releases go on while the journal takes end records,
// in the room it keeps for them), and each Tick tries to write it anew.
// It reads the published view and takes no lock.
func (m *Manager) JournalError() error {
	if v := m.view.Load(); v != nil && v.Unrecorded != "" {
		return errors.New(v.Unrecorded)
	}
	return nil
}

// unrecordedLocked says why leases cannot be recorded, for the view; empty
// when they can.
func (j *journalKeeper) unrecordedLocked() string {
	if j.t.journal.Failed() == nil {
		return ""
	}
	return fmt.Sprintf("cannot record leases (%v): no grants or renewals until the lease journal can be written; releases are recorded in the room it keeps for them", j.t.journal.Failed())
}

// unrecorded is the answer to a change that was not made because it could
// not be recorded.
func unrecorded(what string, err error) error {
	return errdefs.Errorf(errdefs.ErrUnavailable, "the lease journal cannot be written, so %s: %v", what, err)
}

// repairJournalLocked writes a failed journal anew from the table, and once
// that works serves the waiting requests; it reports whether it repaired it.
func (j *journalKeeper) repairJournalLocked() bool {
	if j.t.journal.Failed() == nil {
		return false
	}
	if j.t.journal.Rewrite(j.entriesLocked()) != nil {
		return false
	}
	j.t.log.Warn("lease journal written again: grants and renewals resume", "leases", len(j.t.leases))
	j.t.dirty = true
	j.t.serveWaitersLocked()
	return true
}

// replayLocked decodes the journal b and logs every record it skipped and
// every lease it dropped, by name and why; it returns the leases to take back.
func (j *journalKeeper) replayLocked(b []byte) []journal.Entry {
	rep, err := journal.Decode(b, j.t.shapes())
	if err != nil {
		j.t.log.Error("lease journal not replayed: rebuilding from the pipe-file ledger", "path", j.t.cfg.JournalPath, "err", err)
		return nil
	}
	for _, n := range rep.Skipped {
		attrs := []any{"line", n.Record, "why", n.Why}
		if n.Lease != "" {
			attrs = append(attrs, "names_lease", n.Lease)
		}
		j.t.log.Warn("lease journal record skipped; the records after it still count", attrs...)
	}
	if rep.SkippedMore > 0 {
		j.t.log.Warn("more lease journal records skipped than are listed", "not_listed", rep.SkippedMore)
	}
	for _, n := range rep.Dropped {
		j.t.log.Warn("lease dropped at replay", "lease", n.Lease, "line", n.Record, "why", n.Why)
	}
	return rep.Entries
}
