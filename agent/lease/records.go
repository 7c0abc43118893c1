package lease

import (
	"sort"

	"github.com/gpulet/gpulet/agent/journal"
)

// journalKeeper records the table's changes in the lease journal, writes it
// anew when it has grown or after it failed, and replays it at start. It
// works on the table under its lock; the table's journal field is the file.
type journalKeeper struct{ t *Manager }

// rewriteSlack is how many records beyond twice the live leases the journal
// takes before it is written anew. A rewrite is half a dozen syscalls under
// the lease lock; at 2,048 its share of a lease under churn is a few
// nanoseconds, and the file stays around a megabyte on tmpfs, replayed in
// milliseconds at start.
const rewriteSlack = 2048

// recordLocked appends r to the journal, rewriting it when it has grown; the
// table holds the change already. When r cannot be recorded, the caller undoes
// the change or, for an end, keeps the lease out of the table for the repair
// (repairJournalLocked) to leave out of the journal.
func (j *journalKeeper) recordLocked(r journal.Record) error {
	first := j.t.journal.Failed() == nil
	if err := j.t.journal.Append(r); err != nil {
		if first {
			j.t.log.Error("cannot record leases: no grants or renewals until the lease journal can be written again; releases are recorded in the room it keeps for them", "err", err)
			j.t.dirty = true
		}
		return err
	}
	if j.t.journal.Records() > rewriteSlack+2*len(j.t.leases) {
		if err := j.t.journal.Rewrite(j.entriesLocked()); err != nil {
			j.t.log.Error("cannot rewrite lease journal", "err", err)
		}
	}
	return nil
}

// entry is what the journal keeps of a lease; enc is the lease encoded, nil
// when the record is to encode it.
func (l *lease) entry(enc []byte) *journal.Entry {
	e := &journal.Entry{Lease: *l.Lease, LeaseJSON: enc, Share: l.share}
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
func (j *journalKeeper) entriesLocked() []journal.Entry {
	out := make([]journal.Entry, 0, len(j.t.leases))
	for _, l := range j.t.leases {
		out = append(out, *l.entry(nil))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Lease.ID < out[b].Lease.ID })
	return out
}
