package journal

// Replay: reading a journal back at start, record by record, and checking
// the leases it leaves against the node.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpulet/gpulet/api"
)

// Replay is what a journal's records leave.
type Replay struct {
	// Entries are the leases the journal holds, in the order of their grants.
	Entries []Entry
	// Skipped names the records that could not be used and why, the first
	// maxNotes of them; SkippedMore counts the rest.
	Skipped     []Note
	SkippedMore int
	// Dropped names every lease the journal holds that is not taken back,
	// and why.
	Dropped []Note
}

// Note is one record skipped or one lease dropped.
type Note struct {
	// Record is the line of the record, counting from 1.
	Record int
	// Lease is the lease's id: of a dropped lease, or what a damaged record
	// seems to name (a hint: its bytes are not to be trusted).
	Lease string
	Why   string
	// op is the operation a damaged record seems to be.
	op string
}

// maxNotes bounds the skipped records named one by one.
const maxNotes = 100

// The bindings replay checks apart from the rest, as the lease engine
// journals them (api.Lease.Binding).
const (
	bindingPod   = "pod"
	bindingClaim = "claim"
	bindingSlurm = "slurm"
)

// Decode replays a journal and checks the leases it leaves against the
// node's GPUs. Every line is a record of its own, so a damaged one (bad
// checksum, malformed, too long, an unknown operation) is skipped and named,
// and every other record still counts. An end wins over the grant of the same
// lease wherever the two stand: a lease whose end is recorded never comes
// back. Leases that do not fit the node (unknown GPU, bad units) are dropped
// and named; of two leases on one unit, the one created later is kept, since
// it could only be granted once the other had ended. err is set only for a
// journal of another format, which is not replayed at all.
func Decode(b []byte, gpus []GPUShape) (Replay, error) {
	var out Replay
	skip := func(n int, line []byte, why string) {
		if len(out.Skipped) == maxNotes {
			out.SkippedMore++
			return
		}
		id, op := recordHint(line)
		out.Skipped = append(out.Skipped, Note{Record: n, Lease: id, Why: why, op: op})
	}
	type granted struct {
		// e is the record's own entry, which replay may change.
		e    *Entry
		line int
		// at is the line of the record that set e.Deadline last.
		at int
	}
	// Sized for a journal of grants, a few hundred bytes each, as a rewrite
	// leaves it: no growing while thousands are read.
	grantsHint := len(b)/256 + 1
	grants := make(map[string]*granted, grantsHint)
	order := make([]string, 0, grantsHint)
	ended := map[string]bool{}
	type renewal struct {
		id       string
		line     int
		deadline time.Time
	}
	var renewals []renewal
	for n := 1; len(b) > 0; n++ {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		r, err := decodeRecord(line)
		if err != nil {
			skip(n, line, err.Error())
			continue
		}
		switch r.Op {
		case OpSchema:
			if r.Schema != Schema {
				return Replay{}, fmt.Errorf("journal record %d: the journal is %q, not %s", n, r.Schema, Schema)
			}
		case OpLease:
			if r.Entry == nil || !ValidID(r.Entry.Lease.ID) {
				skip(n, line, "lease record without a valid lease")
				continue
			}
			id := r.Entry.Lease.ID
			if _, dup := grants[id]; dup {
				skip(n, line, "a second grant of the same lease")
				continue
			}
			grants[id] = &granted{e: r.Entry, line: n, at: n}
			order = append(order, id)
		case OpEnd:
			if !ValidID(r.ID) {
				skip(n, line, "end record without a valid lease id")
				continue
			}
			ended[r.ID] = true
		case OpRenew:
			if !ValidID(r.ID) || r.Deadline == nil {
				skip(n, line, "renewal record without a valid lease id and deadline")
				continue
			}
			renewals = append(renewals, renewal{r.ID, n, *r.Deadline})
		default:
			skip(n, line, fmt.Sprintf("unknown operation %q", r.Op))
		}
	}
	for _, rn := range renewals {
		g, ok := grants[rn.id]
		switch {
		case ended[rn.id]:
		case !ok:
			// Its grant was damaged: the renewal is what names the lease.
			out.Dropped = append(out.Dropped, Note{Record: rn.line, Lease: rn.id, Why: "its grant record is damaged or missing (renewed at this line)"})
			ended[rn.id] = true // named once
		case rn.line > g.at:
			// The last deadline in the file counts, as it was written.
			d := rn.deadline
			g.e.Deadline, g.at = &d, rn.line
			exp := d
			g.e.Lease.Expires = &exp
		}
	}
	live := make([]*granted, 0, len(order))
	for _, id := range order {
		if !ended[id] {
			live = append(live, grants[id])
		}
	}
	// Newest first, so that a lease whose end was lost yields its units to
	// the one granted after it; equal times go by place in the file.
	byAge := slices.Clone(live)
	slices.SortStableFunc(byAge, func(a, b *granted) int {
		if c := b.e.Lease.Created.Compare(a.e.Lease.Created); c != 0 {
			return c
		}
		return b.line - a.line
	})
	taken := make(map[[2]int]string, len(live))
	kept := make(map[*granted]bool, len(live))
	for _, g := range byAge {
		if why := checkEntry(g.e, gpus, taken); why != "" {
			out.Dropped = append(out.Dropped, Note{Record: g.line, Lease: g.e.Lease.ID, Why: why})
			continue
		}
		for _, gpu := range leaseGPUs(&g.e.Lease) {
			for _, u := range g.e.Lease.Units {
				taken[[2]int{gpu.Index, u}] = g.e.Lease.ID
			}
		}
		kept[g] = true
	}
	out.Entries = make([]Entry, 0, len(kept))
	for _, g := range live {
		if kept[g] {
			out.Entries = append(out.Entries, *g.e)
		}
	}
	// Name what the damage seems to have cost: a lease whose grant is
	// damaged is lost; one whose end is damaged may be back.
	for i, sk := range out.Skipped {
		g, granted := grants[sk.Lease]
		switch {
		case sk.Lease == "":
		case sk.op == OpLease && !granted && !ended[sk.Lease]:
			out.Dropped = append(out.Dropped, Note{Record: sk.Record, Lease: sk.Lease, Why: "its grant record is damaged"})
			ended[sk.Lease] = true // named once
		case sk.op == OpEnd && granted && kept[g]:
			out.Skipped[i].Why += "; it may have ended lease " + sk.Lease + ", which is kept"
		}
	}
	slices.SortStableFunc(out.Dropped, func(a, b Note) int { return a.Record - b.Record })
	return out, nil
}

// recordHint returns the operation and the first lease id a damaged line seems
// to hold, each "" when it shows none.
func recordHint(line []byte) (id, op string) {
	for _, o := range []string{OpLease, OpEnd, OpRenew} {
		if bytes.Contains(line, []byte(`{"op":"`+o+`"`)) {
			op = o
			break
		}
	}
	const key = `"id":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return "", op
	}
	rest := line[i+len(key):]
	if n := len(IDPrefix) + IDHexLen; len(rest) >= n && ValidID(string(rest[:n])) {
		id = string(rest[:n])
	}
	return id, op
}

func decodeRecord(line []byte) (Record, error) {
	var r Record
	switch {
	case len(line) > maxRecord:
		return r, fmt.Errorf("line of %d bytes, longer than a record may be (%d)", len(line), maxRecord)
	case len(line) < 10 || line[8] != ' ':
		return r, errors.New("malformed line")
	}
	sum, ok := parseHex32(line[:8])
	if !ok {
		if _, err := fmt.Sscanf(string(line[:8]), "%08x", &sum); err != nil {
			return r, errors.New("malformed checksum")
		}
	}
	body := line[9:]
	if crc32.ChecksumIEEE(body) != sum {
		return r, errors.New("checksum mismatch")
	}
	if decodeRecordJSON(body, &r) {
		return r, nil
	}
	r = Record{}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("malformed record: %w", err)
	}
	return r, nil
}

// parseHex32 reads eight hex digits, the checksum as the encoder writes it;
// false for any other text, which decodeRecord leaves to fmt as before.
func parseHex32(b []byte) (uint32, bool) {
	var v uint32
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint32(c)
	}
	return v, len(b) == 8
}

// leaseGPUs is the GPUs whose Units l holds: a whole-GPU lease's list, or
// its one GPU.
func leaseGPUs(l *api.Lease) []api.LeaseGPU {
	if len(l.GPUs) > 0 {
		return l.GPUs
	}
	return []api.LeaseGPU{l.GPU}
}

func checkEntry(e *Entry, gpus []GPUShape, taken map[[2]int]string) string {
	l := e.Lease
	if why := checkUnits(&l, gpus, taken); why != "" {
		return why
	}
	if l.Binding == bindingPod {
		// Bound to neither: the kubelet plugin ends it.
		if e.Deadline != nil || l.Owner.PID != 0 {
			return "pod lease with a process or a deadline"
		}
		return ""
	}
	if l.Binding == bindingClaim {
		// Bound to neither: the DRA driver ends it when the kubelet
		// unprepares its claim.
		if e.Deadline != nil || l.Owner.PID != 0 || l.Claim == nil || l.Claim.UID == "" {
			return "claim lease with a process or a deadline, or without its claim"
		}
		return ""
	}
	if l.Binding == bindingSlurm {
		if e.Deadline != nil || l.Owner.PID != 0 || l.Slurm == nil || !filepath.IsAbs(e.SlurmCgroup) {
			return "Slurm lease with a process or a deadline, or without its job's cgroup"
		}
		return ""
	}
	if (e.Deadline == nil) == (l.Owner.PID == 0) {
		return "neither or both of process and deadline"
	}
	if e.Deadline != nil && e.TTLNanos <= 0 {
		return "deadline without ttl"
	}
	if e.Deadline == nil && e.StartTime == 0 {
		// Bound to whichever process had the pid at restart otherwise.
		return "process-bound lease without its process's start time"
	}
	return ""
}

// checkUnits says why l's GPUs and units do not fit the node, if they do not.
func checkUnits(l *api.Lease, gpus []GPUShape, taken map[[2]int]string) string {
	whole := len(l.GPUs) > 0
	if whole && (l.GPUs[0] != l.GPU || l.Instance != 0) {
		return "whole-GPU lease whose first GPU is not its gpu"
	}
	for i, lg := range leaseGPUs(l) {
		if lg.Index < 0 || lg.Index >= len(gpus) || gpus[lg.Index].UUID != lg.UUID {
			return "GPU not on this node"
		}
		if whole && slices.ContainsFunc(l.GPUs[:i], func(o api.LeaseGPU) bool { return o.Index == lg.Index }) {
			return "whole-GPU lease that names a GPU twice"
		}
		g := gpus[lg.Index]
		most := g.UnitsPerMax
		if l.Binding == bindingPod {
			// A pod lease rebuilt from the kubelet records what a container
			// holds, whatever --units-per-client says now.
			most = g.UnitsTotal
		}
		switch {
		case whole && !everyUnit(l.Units, g.UnitsTotal):
			return "whole-GPU lease without every unit"
		case !whole && (len(l.Units) == 0 || len(l.Units) > most):
			return "bad unit count"
		}
		for _, u := range l.Units {
			if u < 0 || u >= g.UnitsTotal || !whole && g.InstanceOf(u) != l.Instance {
				return fmt.Sprintf("unit %d is not one of instance %d's", u, l.Instance)
			}
			if other := taken[[2]int{lg.Index, u}]; other != "" {
				return fmt.Sprintf("unit %d is also in lease %s, created later: this one had ended", u, other)
			}
		}
	}
	return ""
}

// everyUnit says whether units are 0 to total-1, in order.
func everyUnit(units []int, total int) bool {
	if len(units) != total {
		return false
	}
	for i, u := range units {
		if u != i {
			return false
		}
	}
	return true
}

// A lease id is IDPrefix and IDHexLen lower-case hex digits.
const (
	IDPrefix = "l-"
	IDHexLen = 16
)

// ValidID says whether id is a lease id: the journal takes back no other.
func ValidID(id string) bool {
	if len(id) != len(IDPrefix)+IDHexLen || id[:len(IDPrefix)] != IDPrefix {
		return false
	}
	for _, r := range id[len(IDPrefix):] {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}
