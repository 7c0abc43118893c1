package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/jsonenc"
	"github.com/gpulet/gpulet/internal/statefile"
)

// JournalSchema names the journal's format; it is the first record of a file.
const JournalSchema = "gpulet.journal/v2"

// The journal (<run-dir>/leases.journal) is an append-only log of checksummed
// records, one line each: "%08x %s\n", the CRC-32 of the JSON record, then the
// record. A grant, an end or a renewal appends one record with one write, before
// the API answers; a rewrite holding just the live leases (temp file and rename)
// keeps it short. It lives in the run dir (tmpfs in production) because leases
// cannot outlive a reboot, and it is not fsynced: it must survive the daemon's
// crash, not the kernel's.
//
// What cannot be recorded is not promised: when an append fails (a full run
// dir), the part it wrote is cut off, and the journal takes no record until it
// has been written anew from the table; meanwhile the Manager grants, releases
// and renews nothing. Replay reads every line on its own, so one damaged
// record costs that record, never the ones after it.
type record struct {
	Op string `json:"op"`
	// Schema is set on the "schema" record that opens a file.
	Schema string        `json:"schema,omitempty"`
	Entry  *journalEntry `json:"entry,omitempty"`
	// ID names the lease of an "end" or "renew" record.
	ID       string     `json:"id,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
	// PeakMemoryMiB is, on an "end" record, the most GPU memory the lease's
	// processes used, where it was measured.
	PeakMemoryMiB uint64 `json:"peak_memory_mib,omitempty"`
}

// Record operations.
const (
	opSchema = "schema"
	opLease  = "lease"
	opEnd    = "end"
	opRenew  = "renew"
)

type journalEntry struct {
	Lease api.Lease `json:"lease"`
	// StartTime is the holder process's start time (process-bound leases).
	StartTime uint64 `json:"start_time,omitempty"`
	// Deadline is when a time-bound lease ends unless renewed.
	Deadline *time.Time `json:"deadline,omitempty"`
	// TTLNanos is the renewal period of a time-bound lease.
	TTLNanos int64 `json:"ttl_ns,omitempty"`
	// Share is the share member a borrowed lease counts toward (its
	// reservation's share group, as given), for reclaiming by weight.
	Share string `json:"share,omitempty"`
	// SlurmCgroup is the cgroup folder of a Slurm lease's job (or step).
	SlurmCgroup string `json:"slurm_cgroup,omitempty"`

	// leaseJSON, when set, is Lease already encoded: the record is then
	// assembled around it instead of encoding the lease again. When nil,
	// the record encodes Lease in place.
	leaseJSON []byte
}

// gpuShape is what the decoder checks entries against.
type gpuShape struct {
	UUID        string
	UnitsTotal  int
	InstanceOf  func(unit int) int
	UnitsPerMax int
}

// maxKeptRecord is the largest line buffer a journal keeps for the next record.
const maxKeptRecord = 16 << 10

// maxRecord bounds one line, far above any real lease record.
const maxRecord = 1 << 20

func encodeRecord(r record) ([]byte, error) { return appendRecord(nil, r) }

// appendRecord appends r's line to dst.
func appendRecord(dst []byte, r record) ([]byte, error) {
	// The line is built in one buffer: the checksum's place first, then the
	// record, then the checksum written into its place.
	const prefix = 9 // "%08x "
	start := len(dst)
	out := append(dst, "00000000 "...)
	if b, ok := appendRecordJSON(out, r); ok {
		out = b
	} else {
		b, err := json.Marshal(r)
		if err != nil {
			return dst, err
		}
		out = append(out, b...)
	}
	appendHex32(out[start:start], crc32.ChecksumIEEE(out[start+prefix:]))
	return append(out, '\n'), nil
}

// appendRecordJSON appends the JSON of the records written on every grant,
// release and renewal: the same bytes json.Marshal makes (tests hold it to
// that), without walking them by reflection each time. It reports false,
// having appended nothing, for any other record.
func appendRecordJSON(b []byte, r record) ([]byte, bool) {
	if r.Schema != "" {
		return b, false
	}
	switch {
	case r.Op == opLease && r.ID == "" && r.Deadline == nil && r.Entry != nil:
		if e := r.Entry; e.Deadline == nil || jsonenc.TimeOK(*e.Deadline) {
			return appendLeaseRecord(b, e)
		}
	case r.Op == opEnd && r.Entry == nil && r.Deadline == nil:
		b = append(b, `{"op":"end"`...)
		b = jsonenc.OptionalString(b, `,"id":`, r.ID)
		if r.PeakMemoryMiB != 0 {
			b = append(b, `,"peak_memory_mib":`...)
			b = strconv.AppendUint(b, r.PeakMemoryMiB, 10)
		}
		return append(b, '}'), true
	case r.Op == opRenew && r.Entry == nil && r.Deadline != nil && jsonenc.TimeOK(*r.Deadline):
		b = append(b, `{"op":"renew"`...)
		b = jsonenc.OptionalString(b, `,"id":`, r.ID)
		b = append(b, `,"deadline":`...)
		return append(jsonenc.Time(b, *r.Deadline), '}'), true
	}
	return b, false
}

// appendLeaseRecord appends the JSON of record{Op: opLease, Entry: e} around
// e's encoded lease, or encodes it in place. It reports false, having
// appended nothing, for a lease appendLeaseJSON leaves to encoding/json.
func appendLeaseRecord(b []byte, e *journalEntry) ([]byte, bool) {
	start := len(b)
	b = append(b, `{"op":"lease","entry":{"lease":`...)
	if e.leaseJSON != nil {
		b = append(b, e.leaseJSON...)
	} else if lb, ok := appendLeaseJSON(b, &e.Lease); ok {
		b = lb
	} else {
		return b[:start], false
	}
	if e.StartTime != 0 {
		b = append(b, `,"start_time":`...)
		b = strconv.AppendUint(b, e.StartTime, 10)
	}
	if e.Deadline != nil {
		b = append(b, `,"deadline":`...)
		b = jsonenc.Time(b, *e.Deadline)
	}
	if e.TTLNanos != 0 {
		b = append(b, `,"ttl_ns":`...)
		b = strconv.AppendInt(b, e.TTLNanos, 10)
	}
	b = jsonenc.OptionalString(b, `,"share":`, e.Share)
	b = jsonenc.OptionalString(b, `,"slurm_cgroup":`, e.SlurmCgroup)
	return append(b, "}}"...), true
}

// appendHex32 appends v as eight lower-case hex digits.
func appendHex32(b []byte, v uint32) []byte {
	const digits = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

// journalFile is what the journal appends through: the open file, or a
// test's stand-in that fails where the test wants.
type journalFile interface {
	io.Writer
	Truncate(size int64) error
	Close() error
}

// journal is the open log. Nothing is appended while failed is set: the file
// may then be behind the table (an end that could not be recorded) or end in
// part of a record, and only a rewrite from the table puts it right.
type journal struct {
	path string
	f    journalFile
	// size is the file's length up to the end of its last whole record, where
	// a failed append is cut back to.
	size int64
	// records counts the records appended since the last rewrite.
	records int
	// failed says why records cannot be written; nil when they can.
	failed error
	// buf is the last record's line, kept to build the next one in.
	buf []byte
}

// rewrite replaces the journal with one holding just entries, and opens it for
// appending. When the new file cannot be written the old one stays in place,
// whole: a journal that was working goes on appending to it (and tries again a
// period later), a failed one stays failed.
func (j *journal) rewrite(entries []journalEntry) error {
	// Records are appended to one buffer, sized for a lease record of a
	// few hundred bytes each: no copies as it grows.
	buf, err := appendRecord(make([]byte, 0, 512*(len(entries)+1)), record{Op: opSchema, Schema: JournalSchema})
	if err != nil {
		return err
	}
	for i := range entries {
		if buf, err = appendRecord(buf, record{Op: opLease, Entry: &entries[i]}); err != nil {
			return err
		}
	}
	if err := statefile.Replace(j.path, buf, 0o600); err != nil {
		err = fmt.Errorf("writing %s anew: %w", j.path, err)
		if j.f == nil || j.failed != nil {
			j.failed = err
		}
		j.records = 0
		return err
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		// The old descriptor names the file just replaced: appending there
		// would record nothing.
		j.close()
		j.failed = fmt.Errorf("opening %s: %w", j.path, err)
		return j.failed
	}
	j.close()
	j.f, j.size, j.records, j.failed = f, int64(len(buf)), 0, nil
	return nil
}

// append writes one record with one write(2). When the write fails, what it
// wrote of the record is cut off again before anything else can follow it, and
// the journal is failed until a rewrite.
func (j *journal) append(r record) error {
	if j.failed != nil {
		return j.failed
	}
	if j.f == nil {
		return errors.New("journal is not open")
	}
	b, err := appendRecord(j.buf[:0], r)
	if err != nil {
		return err
	}
	if cap(b) <= maxKeptRecord {
		// A rare large record (labels) is not kept for ever.
		j.buf = b
	}
	n, err := j.f.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		j.failed = err
		if n > 0 {
			if terr := j.f.Truncate(j.size); terr != nil {
				j.failed = fmt.Errorf("%w; and cutting off the part of a record it left failed too: %v", err, terr)
			}
		}
		return j.failed
	}
	j.size += int64(n)
	j.records++
	return nil
}

// rewriteSlack is how many records beyond twice the live leases the journal
// takes before it is written anew. A rewrite is half a dozen syscalls under
// the lease lock; at 2,048 its share of a lease under churn is a few
// nanoseconds, and the file stays around a megabyte on tmpfs, replayed in
// milliseconds at start.
const rewriteSlack = 2048

// due says whether the log has grown enough, against live leases, to rewrite.
func (j *journal) due(live int) bool { return j.records > rewriteSlack+2*live }

func (j *journal) close() error {
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
