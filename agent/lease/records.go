package lease

import "sort"

// recordLocked appends r to the journal, rewriting it when it has grown; the
// table holds the change already. When r cannot be recorded, the caller undoes
// the change or, for an end, keeps the lease out of the table for the repair
// (repairJournalLocked) to leave out of the journal.
func (m *Manager) recordLocked(r record) error {
	first := m.journal.failed == nil
	if err := m.journal.append(r); err != nil {
		if first {
			m.log.Error("cannot record leases: no grants, releases or renewals until the lease journal can be written again", "err", err)
			m.dirty = true
		}
		return err
	}
	if m.journal.due(len(m.leases)) {
		if err := m.journal.rewrite(m.entriesLocked()); err != nil {
			m.log.Error("cannot rewrite lease journal", "err", err)
		}
	}
	return nil
}

// entry is what the journal keeps of a lease; enc is the lease encoded, nil
// when the record is to encode it.
func (l *lease) entry(enc []byte) *journalEntry {
	e := &journalEntry{Lease: *l.Lease, leaseJSON: enc, Share: l.share}
	switch b := l.bind.(type) {
	case *pidBinding:
		e.StartTime = b.startTime
	case *ttlBinding:
		d := b.deadline
		e.Deadline = &d
		e.TTLNanos = int64(b.ttl)
	case *slurmBinding:
		e.SlurmCgroup = b.dir
	}
	return e
}

// entriesLocked lists every live lease's journal entry, by id.
func (m *Manager) entriesLocked() []journalEntry {
	out := make([]journalEntry, 0, len(m.leases))
	for _, l := range m.leases {
		out = append(out, *l.entry(nil))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Lease.ID < out[b].Lease.ID })
	return out
}
