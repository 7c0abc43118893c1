// Package journal is gpuletd's lease journal (<run-dir>/leases.journal): its
// records, their encoding, the append-only file they are written to, and the
// replay that reads them back at start. It knows leases only as api.Lease
// and the entries the lease engine gives it, and takes no lock: its caller
// serializes the calls on one File.
//
// The journal is an append-only log of checksummed records, one line each:
// "%08x %s\n", the CRC-32 of the JSON record, then the record. A grant, an
// end or a renewal appends one record with one write, before the API answers;
// a rewrite holding just the live leases (temp file and rename) keeps it short. It lives in the run dir (tmpfs in production) because leases
// cannot outlive a reboot, and it is not fsynced: it must survive the daemon's
// crash, not the kernel's.
//
// What cannot be recorded is not promised: when an append fails (a full run
// dir), the part it wrote is cut off, and the journal takes no record until it
// has been written anew from the table; meanwhile the lease engine grants,
// releases and renews nothing. Replay reads every line on its own, so one
// damaged record costs that record, never the ones after it.
package journal

import (
	"encoding/json"
	"hash/crc32"
	"strconv"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/jsonenc"
)

// Schema names the journal's format; it is the first record of a file.
const Schema = "gpulet.journal/v2"

// Record is one line of the journal.
type Record struct {
	Op string `json:"op"`
	// Schema is set on the "schema" record that opens a file.
	Schema string `json:"schema,omitempty"`
	Entry  *Entry `json:"entry,omitempty"`
	// ID names the lease of an "end" or "renew" record.
	ID       string     `json:"id,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
	// PeakMemoryMiB is, on an "end" record, the most GPU memory the lease's
	// processes used, where it was measured.
	PeakMemoryMiB uint64 `json:"peak_memory_mib,omitempty"`
}

// Record operations.
const (
	OpSchema = "schema"
	OpLease  = "lease"
	OpEnd    = "end"
	OpRenew  = "renew"
)

// Entry is what the journal keeps of a lease: the lease as the API shows it,
// and what binds it.
type Entry struct {
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

	// LeaseJSON, when set, is Lease already encoded (AppendLease): the
	// record is then assembled around it instead of encoding the lease
	// again. When nil, the record encodes Lease in place.
	LeaseJSON []byte `json:"-"`
}

// GPUShape is what replay checks a lease against: one GPU of the node.
type GPUShape struct {
	UUID        string
	UnitsTotal  int
	InstanceOf  func(unit int) int
	UnitsPerMax int
}

// maxKeptRecord is the largest line buffer a journal keeps for the next record.
const maxKeptRecord = 16 << 10

// maxRecord bounds one line, far above any real lease record.
const maxRecord = 1 << 20

// AppendRecord appends r's line to dst.
func AppendRecord(dst []byte, r Record) ([]byte, error) {
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
func appendRecordJSON(b []byte, r Record) ([]byte, bool) {
	if r.Schema != "" {
		return b, false
	}
	switch {
	case r.Op == OpLease && r.ID == "" && r.Deadline == nil && r.Entry != nil:
		if e := r.Entry; e.Deadline == nil || jsonenc.TimeOK(*e.Deadline) {
			return appendLeaseRecord(b, e)
		}
	case r.Op == OpEnd && r.Entry == nil && r.Deadline == nil:
		b = append(b, `{"op":"end"`...)
		b = jsonenc.OptionalString(b, `,"id":`, r.ID)
		if r.PeakMemoryMiB != 0 {
			b = append(b, `,"peak_memory_mib":`...)
			b = strconv.AppendUint(b, r.PeakMemoryMiB, 10)
		}
		return append(b, '}'), true
	case r.Op == OpRenew && r.Entry == nil && r.Deadline != nil && jsonenc.TimeOK(*r.Deadline):
		b = append(b, `{"op":"renew"`...)
		b = jsonenc.OptionalString(b, `,"id":`, r.ID)
		b = append(b, `,"deadline":`...)
		return append(jsonenc.Time(b, *r.Deadline), '}'), true
	}
	return b, false
}

// appendLeaseRecord appends the JSON of Record{Op: OpLease, Entry: e} around
// e's encoded lease, or encodes it in place. It reports false, having
// appended nothing, for a lease AppendLease leaves to encoding/json.
func appendLeaseRecord(b []byte, e *Entry) ([]byte, bool) {
	start := len(b)
	b = append(b, `{"op":"lease","entry":{"lease":`...)
	if e.LeaseJSON != nil {
		b = append(b, e.LeaseJSON...)
	} else if lb, ok := AppendLease(b, &e.Lease); ok {
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
