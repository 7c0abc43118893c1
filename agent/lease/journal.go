package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"time"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/api"
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
type record struct {
	Op string `json:"op"`
	// Schema is set on the "schema" record that opens a file.
	Schema string        `json:"schema,omitempty"`
	Entry  *journalEntry `json:"entry,omitempty"`
	// ID names the lease of an "end" or "renew" record.
	ID       string     `json:"id,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
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

	// leaseJSON, when set, is Lease already encoded: the record is then
	// assembled around it instead of encoding the lease again.
	leaseJSON []byte
}

// gpuShape is what the decoder checks entries against.
type gpuShape struct {
	UUID        string
	UnitsTotal  int
	InstanceOf  func(unit int) int
	UnitsPerMax int
}

// maxRecord bounds one line, far above any real lease record.
const maxRecord = 1 << 20

func encodeRecord(r record) ([]byte, error) {
	// The line is built in one buffer: the checksum's place first, then the
	// record, then the checksum written into its place.
	const prefix = 9 // "%08x "
	var out []byte
	if r.Op == opLease && r.Schema == "" && r.ID == "" && r.Deadline == nil && r.Entry != nil && r.Entry.leaseJSON != nil {
		out = appendLeaseRecord(make([]byte, prefix, prefix+len(r.Entry.leaseJSON)+160), r.Entry)
	} else {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		out = append(make([]byte, prefix, prefix+len(b)+1), b...)
	}
	appendHex32(out[:0], crc32.ChecksumIEEE(out[prefix:]))
	out[prefix-1] = ' '
	return append(out, '\n'), nil
}

// appendLeaseRecord appends the JSON of record{Op: opLease, Entry: e} around
// e's encoded lease: the same bytes json.Marshal makes (a test holds it to
// that), without walking the lease by reflection on every grant.
func appendLeaseRecord(b []byte, e *journalEntry) []byte {
	b = append(b, `{"op":"lease","entry":{"lease":`...)
	b = append(b, e.leaseJSON...)
	if e.StartTime != 0 {
		b = append(b, `,"start_time":`...)
		b = strconv.AppendUint(b, e.StartTime, 10)
	}
	if e.Deadline != nil {
		b = append(b, `,"deadline":"`...)
		b = e.Deadline.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if e.TTLNanos != 0 {
		b = append(b, `,"ttl_ns":`...)
		b = strconv.AppendInt(b, e.TTLNanos, 10)
	}
	return append(b, "}}"...)
}

// appendHex32 appends v as eight lower-case hex digits.
func appendHex32(b []byte, v uint32) []byte {
	const digits = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

// decodeJournal replays a journal and checks the leases it leaves against the
// node's GPUs. A damaged record (bad checksum, malformed JSON, unknown
// operation) stops the replay: what came before it is kept and err says where
// it stopped. Leases that do not fit the node (unknown GPU, bad units, a unit
// in two leases) are dropped and listed in dropped.
func decodeJournal(b []byte, gpus []gpuShape) (entries []journalEntry, dropped []string, err error) {
	live := map[string]journalEntry{}
	var order []string
	for n := 1; len(b) > 0; n++ {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		r, rerr := decodeRecord(line)
		if rerr == nil && n == 1 && (r.Op != opSchema || r.Schema != JournalSchema) {
			rerr = fmt.Errorf("not a %s journal", JournalSchema)
		}
		if rerr == nil && n > 1 {
			rerr = applyRecord(live, &order, r)
		}
		if rerr != nil {
			err = fmt.Errorf("journal record %d: %w", n, rerr)
			break
		}
	}
	taken := map[[2]int]bool{}
	for _, id := range order {
		e, ok := live[id]
		if !ok {
			continue
		}
		if why := checkEntry(e, gpus, taken); why != "" {
			dropped = append(dropped, fmt.Sprintf("lease %q: %s", id, why))
			continue
		}
		for _, u := range e.Lease.Units {
			taken[[2]int{e.Lease.GPU.Index, u}] = true
		}
		entries = append(entries, e)
	}
	return entries, dropped, err
}

func decodeRecord(line []byte) (record, error) {
	var r record
	if len(line) < 10 || line[8] != ' ' || len(line) > maxRecord {
		return r, errors.New("malformed line")
	}
	var sum uint32
	if _, err := fmt.Sscanf(string(line[:8]), "%08x", &sum); err != nil {
		return r, errors.New("malformed checksum")
	}
	body := line[9:]
	if crc32.ChecksumIEEE(body) != sum {
		return r, errors.New("checksum mismatch")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("malformed record: %w", err)
	}
	return r, nil
}

func applyRecord(live map[string]journalEntry, order *[]string, r record) error {
	switch r.Op {
	case opLease:
		if r.Entry == nil || !validID(r.Entry.Lease.ID) {
			return errors.New("lease record without a valid lease")
		}
		id := r.Entry.Lease.ID
		if _, dup := live[id]; !dup {
			*order = append(*order, id)
		}
		live[id] = *r.Entry
	case opEnd:
		delete(live, r.ID)
	case opRenew:
		e, ok := live[r.ID]
		if !ok || r.Deadline == nil {
			return errors.New("renewal of an unknown lease")
		}
		d := *r.Deadline
		e.Deadline = &d
		exp := d
		e.Lease.Expires = &exp
		live[r.ID] = e
	default:
		return fmt.Errorf("unknown operation %q", r.Op)
	}
	return nil
}

func checkEntry(e journalEntry, gpus []gpuShape, taken map[[2]int]bool) string {
	l := e.Lease
	if l.GPU.Index < 0 || l.GPU.Index >= len(gpus) || gpus[l.GPU.Index].UUID != l.GPU.UUID {
		return "GPU not on this node"
	}
	g := gpus[l.GPU.Index]
	if len(l.Units) == 0 || len(l.Units) > g.UnitsPerMax {
		return "bad unit count"
	}
	for _, u := range l.Units {
		if u < 0 || u >= g.UnitsTotal || g.InstanceOf(u) != l.Instance || taken[[2]int{l.GPU.Index, u}] {
			return "bad or shared unit"
		}
	}
	if (e.Deadline == nil) == (l.Owner.PID == 0) {
		return "neither or both of process and deadline"
	}
	if e.Deadline != nil && e.TTLNanos <= 0 {
		return "deadline without ttl"
	}
	return ""
}

// validID accepts the ids newID makes.
func validID(id string) bool {
	if len(id) != len(idPrefix)+idHexLen || id[:len(idPrefix)] != idPrefix {
		return false
	}
	for _, r := range id[len(idPrefix):] {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// journal is the open log.
type journal struct {
	path string
	f    *os.File
	// records counts the records appended since the last rewrite.
	records int
}

// rewrite replaces the journal with one holding just entries, and opens it for
// appending.
func (j *journal) rewrite(entries []journalEntry) error {
	var buf bytes.Buffer
	recs := []record{{Op: opSchema, Schema: JournalSchema}}
	for i := range entries {
		recs = append(recs, record{Op: opLease, Entry: &entries[i]})
	}
	for _, r := range recs {
		b, err := encodeRecord(r)
		if err != nil {
			return err
		}
		buf.Write(b)
	}
	if err := ledger.WriteFileAtomic(j.path, buf.Bytes(), 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.records = f, 0
	return nil
}

// append writes one record with one write(2).
func (j *journal) append(r record) error {
	if j.f == nil {
		return errors.New("journal is not open")
	}
	b, err := encodeRecord(r)
	if err != nil {
		return err
	}
	if _, err := j.f.Write(b); err != nil {
		return err
	}
	j.records++
	return nil
}

// due says whether the log has grown enough, against live leases, to rewrite.
func (j *journal) due(live int) bool { return j.records > 256+2*live }

func (j *journal) close() error {
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
