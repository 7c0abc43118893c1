package lease

// This file is what the Manager does when the journal was found damaged: name
// what a replay skipped and lost.

// replayLocked decodes the journal b and logs every record it skipped and
// every lease it dropped, by name and why; it returns the leases to take back.
func (m *Manager) replayLocked(b []byte) []journalEntry {
	rep, err := decodeJournal(b, m.shapes())
	if err != nil {
		m.log.Error("lease journal not replayed: rebuilding from the pipe-file ledger", "path", m.cfg.JournalPath, "err", err)
		return nil
	}
	for _, n := range rep.skipped {
		attrs := []any{"line", n.Record, "why", n.Why}
		if n.Lease != "" {
			attrs = append(attrs, "names_lease", n.Lease)
		}
		m.log.Warn("lease journal record skipped; the records after it still count", attrs...)
	}
	if rep.skippedMore > 0 {
		m.log.Warn("more lease journal records skipped than are listed", "not_listed", rep.skippedMore)
	}
	for _, n := range rep.dropped {
		m.log.Warn("lease dropped at replay", "lease", n.Lease, "line", n.Record, "why", n.Why)
	}
	return rep.entries
}
