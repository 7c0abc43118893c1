package journal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// The lease record assembled around the lease's own encoding must be exactly
// what encoding/json makes of the record, so that the decoder reads it like
// every other record.
func TestLeaseRecordIsWhatJSONMakes(t *testing.T) {
	created := time.Date(2026, 11, 23, 12, 0, 0, 123456789, time.UTC)
	deadline := created.Add(90 * time.Second)
	base := api.Lease{
		ID: "l-0123456789abcdef", GPU: api.LeaseGPU{Index: 1, UUID: "GPU-x"}, Instance: 2, Units: []int{8, 9},
		Owner: api.Owner{UID: 1000, GID: 1000, PID: 4242}, Created: created,
		Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"},
	}
	timed := base
	timed.Owner.PID = 0
	timed.Expires, timed.TTL = &deadline, "1m30s"
	labelled := base
	labelled.Labels = map[string]string{"job": `a "quoted" <tag> & \ back`, "ünï": "ç\u2028"}
	labelled.Task, labelled.Reservation, labelled.MemoryMiB = "train\tlong", "r1", 4096
	borrowed := base
	borrowed.Preemptible, borrowed.Reservation = true, "wf1"
	roundSecond := timed
	d2 := deadline.Truncate(time.Second)
	for name, e := range map[string]Entry{
		"process-bound": {Lease: base, StartTime: 987654321},
		"time-bound":    {Lease: timed, Deadline: &deadline, TTLNanos: int64(90 * time.Second)},
		"whole seconds": {Lease: roundSecond, Deadline: &d2, TTLNanos: int64(time.Minute)},
		"labels":        {Lease: labelled, StartTime: 1},
		"borrowed":      {Lease: borrowed, StartTime: 2, Share: "group:ml"},
		"odd share":     {Lease: borrowed, StartTime: 2, Share: "a\"b<c>\u00e9"},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := jsonRecordLine(Record{Op: OpLease, Entry: &e})
			if err != nil {
				t.Fatal(err)
			}
			for _, how := range []string{"encoded in place", "around its encoding"} {
				if how == "around its encoding" {
					if e.LeaseJSON, err = json.Marshal(e.Lease); err != nil {
						t.Fatal(err)
					}
				}
				got, err := AppendRecord(nil, Record{Op: OpLease, Entry: &e})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("record assembled %s\n%s\ndiffers from encoding/json's\n%s", how, got, want)
				}
				r, err := decodeRecord(bytes.TrimSuffix(got, []byte("\n")))
				if err != nil || r.Entry == nil || r.Entry.Lease.ID != e.Lease.ID {
					t.Fatalf("decoding the record assembled %s: %+v, %v", how, r, err)
				}
			}
		})
	}
}

// FuzzLeaseRecordIsWhatJSONMakes holds the assembled lease record to
// encoding/json's bytes for whatever text a request may carry and any
// deadline a lease may have.
func FuzzLeaseRecordIsWhatJSONMakes(f *testing.F) {
	f.Add("train", "job", "a \"b\" <c>", uint64(12345), int64(90e9), int64(1))
	f.Add("", "", "", uint64(0), int64(0), int64(0))
	f.Add("\u2028x", "ü\xff", "\x00", uint64(1)<<63, int64(30*24*time.Hour), int64(-1))
	f.Fuzz(func(t *testing.T, task, key, value string, start uint64, ttl int64, nanos int64) {
		created := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC).Add(time.Duration(nanos))
		l := api.Lease{
			ID: "l-0123456789abcdef", GPU: api.LeaseGPU{UUID: "GPU-x"}, Units: []int{0},
			Owner: api.Owner{PID: 1}, Created: created, Task: task,
			Labels: map[string]string{key: value}, Env: map[string]string{"K": value},
		}
		e := Entry{Lease: l, StartTime: start}
		if ttl > 0 && ttl <= int64(30*24*time.Hour) { // the API's longest ttl
			d := created.Add(time.Duration(ttl))
			e.Deadline, e.TTLNanos = &d, ttl
		}
		want, err := jsonRecordLine(Record{Op: OpLease, Entry: &e})
		if err != nil {
			t.Skip(err)
		}
		inPlace, err := AppendRecord(nil, Record{Op: OpLease, Entry: &e})
		if err != nil || !bytes.Equal(inPlace, want) {
			t.Fatalf("record encoded in place\n%s\ndiffers from encoding/json's\n%s (%v)", inPlace, want, err)
		}
		if e.LeaseJSON, err = json.Marshal(e.Lease); err != nil {
			t.Fatal(err)
		}
		got, err := AppendRecord(nil, Record{Op: OpLease, Entry: &e})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("assembled record\n%s\ndiffers from encoding/json's\n%s (%v)", got, want, err)
		}
	})
}

// jsonRecordLine is r's journal line as encoding/json makes its record.
func jsonRecordLine(r Record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "%08x %s\n", crc32.ChecksumIEEE(b), b), nil
}

// journalHistory is a journal the test built from real records, and what it
// knows of each lease in it.
type journalHistory struct {
	text []byte
	ids  []string
	// grant is each lease's grant record as the file holds it, no newline.
	grant map[string]string
	// ended says which leases ended at some point of the history.
	ended map[string]bool
	// lines holds every record line of text.
	lines map[string]bool
}

// buildHistory plays a history of grants, ends, renewals and rewrites on the
// node of replayShapes, as the Manager would record them, chosen by seed.
func buildHistory(t testing.TB, seed uint64) journalHistory {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	base := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	h := journalHistory{grant: map[string]string{}, ended: map[string]bool{}, lines: map[string]bool{}}
	schema := Record{Op: OpSchema, Schema: Schema}
	recs := []Record{schema}
	live := map[string]Entry{}
	var liveIDs []string
	var used [16]bool
	// grantRecord copies e, so that a later renewal changes only later records.
	grantRecord := func(e Entry) Record {
		if e.Deadline != nil {
			d, exp := *e.Deadline, *e.Deadline
			e.Deadline, e.Lease.Expires = &d, &exp
		}
		return Record{Op: OpLease, Entry: &e}
	}
	steps := 20 + rng.IntN(30)
	for step := 0; step < steps; step++ {
		now := base.Add(time.Duration(step) * time.Second)
		switch x := rng.IntN(20); {
		case x < 10:
			k, n := rng.IntN(2), 1+rng.IntN(2)
			var units []int
			for u := k * 8; u < k*8+8 && len(units) < n; u++ {
				if !used[u] {
					units = append(units, u)
				}
			}
			if len(units) < n {
				continue
			}
			e := Entry{Lease: api.Lease{
				ID: fmt.Sprintf("l-%016x", seed*1000003+uint64(step)), GPU: api.LeaseGPU{UUID: "GPU-a"},
				Instance: k, Units: units, Created: now,
			}}
			if rng.IntN(2) == 0 {
				e.Lease.Owner.PID, e.StartTime = 100+step, uint64(step+1)
			} else {
				d := now.Add(time.Hour)
				e.Deadline, e.TTLNanos, e.Lease.Expires, e.Lease.TTL = &d, int64(time.Hour), &d, "1h0m0s"
			}
			for _, u := range units {
				used[u] = true
			}
			live[e.Lease.ID] = e
			liveIDs = append(liveIDs, e.Lease.ID)
			h.ids = append(h.ids, e.Lease.ID)
			recs = append(recs, grantRecord(e))
		case x < 16:
			if len(liveIDs) == 0 {
				continue
			}
			i := rng.IntN(len(liveIDs))
			id := liveIDs[i]
			for _, u := range live[id].Lease.Units {
				used[u] = false
			}
			delete(live, id)
			liveIDs = append(liveIDs[:i], liveIDs[i+1:]...)
			h.ended[id] = true
			recs = append(recs, Record{Op: OpEnd, ID: id})
		case x < 19:
			if len(liveIDs) == 0 {
				continue
			}
			id := liveIDs[rng.IntN(len(liveIDs))]
			e := live[id]
			if e.Deadline == nil {
				continue
			}
			d := now.Add(time.Hour)
			e.Deadline, e.Lease.Expires = &d, &d
			live[id] = e
			d2 := d
			recs = append(recs, Record{Op: OpRenew, ID: id, Deadline: &d2})
		default:
			// A rewrite: just the live leases, by id, as the Manager writes them.
			recs = []Record{schema}
			for _, id := range slices.Sorted(maps.Keys(live)) {
				recs = append(recs, grantRecord(live[id]))
			}
		}
	}
	for _, r := range recs {
		b, err := AppendRecord(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		line := string(b[:len(b)-1])
		h.lines[line] = true
		if r.Op == OpLease {
			h.grant[r.Entry.Lease.ID] = line
		}
		h.text = append(h.text, b...)
	}
	return h
}

// damageJournal applies the damage that d describes to text: flipped bytes,
// cut ranges, inserted junk, swapped and copied blocks of lines, and lines
// too long, empty or of an unknown operation.
func damageJournal(t testing.TB, text, d []byte) []byte {
	out := bytes.Clone(text)
	next := func() int {
		if len(d) == 0 {
			return 0
		}
		v := int(d[0])
		d = d[1:]
		return v
	}
	pos := func(n int) int {
		if n <= 0 {
			return 0
		}
		return (next()<<8 | next()) % n
	}
	lines := func() []string { return strings.SplitAfter(string(out), "\n") }
	for ops := 0; len(d) > 0 && ops < 16; ops++ {
		switch next() % 6 {
		case 0: // flip bits of one byte
			if len(out) > 0 {
				i := pos(len(out))
				out[i] ^= byte(next() | 1)
			}
		case 1: // cut a range, newlines included
			i := pos(len(out))
			out = slices.Delete(out, i, min(len(out), i+1+next()%64))
		case 2: // insert junk
			i := pos(len(out) + 1)
			n := 1 + next()%32
			junk := d[:min(n, len(d))]
			d = d[len(junk):]
			out = slices.Insert(out, i, junk...)
		case 3: // swap two blocks of whole lines
			ls := lines()
			a, b, n := pos(len(ls)), pos(len(ls)), 1+next()%4
			if a > b {
				a, b = b, a
			}
			if a+n > b || b+n > len(ls) {
				continue
			}
			var s []string
			s = append(s, ls[:a]...)
			s = append(s, ls[b:b+n]...)
			s = append(s, ls[a+n:b]...)
			s = append(s, ls[a:a+n]...)
			s = append(s, ls[b+n:]...)
			out = []byte(strings.Join(s, ""))
		case 4: // copy a block of whole lines elsewhere
			ls := lines()
			a, n, at := pos(len(ls)), 1+next()%3, pos(len(ls)+1)
			block := slices.Clone(ls[a:min(len(ls), a+n)])
			out = []byte(strings.Join(slices.Insert(ls, at, block...), ""))
		case 5: // a whole line of another kind
			ls := lines()
			at := pos(len(ls) + 1)
			var line string
			switch next() % 3 {
			case 0:
				line = strings.Repeat("x", maxRecord+1) + "\n"
			case 1:
				line = journalText(t, Record{Op: "compact"})
			case 2:
				line = "\n"
			}
			out = []byte(strings.Join(slices.Insert(ls, at, line), ""))
		}
	}
	return out
}

// FuzzJournalReplay damages journals built from real records and holds the
// replay to what the test knows: a lease whose own grant record is intact and
// whose end was never recorded is kept; a lease whose end record is in the
// file never comes back; no unit is in two leases.
func FuzzJournalReplay(f *testing.F) {
	f.Add(uint64(1), []byte{})
	f.Add(uint64(2), []byte{0, 0, 120, 7})                              // a flipped byte in an early record
	f.Add(uint64(3), []byte{5, 0, 3, 0})                                // a line too long, mid-file
	f.Add(uint64(4), []byte{5, 0, 2, 1})                                // an unknown operation
	f.Add(uint64(5), []byte{3, 0, 1, 0, 9, 3})                          // blocks swapped: ends before grants
	f.Add(uint64(6), []byte{1, 1, 0, 200, 2, 2, 40, 10, 'j', 'u', 'n'}) // a cut, then junk
	f.Add(uint64(7), []byte{4, 0, 3, 2, 0, 0, 0, 0, 7, 0, 9, 1, 0})     // lines copied, a flip, a long line
	f.Add(uint64(8), []byte{1, 3, 232, 63, 0, 1, 44, 255, 3, 0, 2, 0, 5, 0})
	f.Add(uint64(9), []byte{5, 0, 0, 2, 5, 0, 9, 2, 2, 0, 0, 5, '\n', '\n', '\n', 'x', '{'})
	f.Add(uint64(3), []byte("9),000000000")) // lines copied: a grant after its end
	f.Add(uint64(12), []byte("1%\xe8000"))   // an end cut: its lease meets the next one on a unit
	f.Fuzz(func(t *testing.T, seed uint64, damage []byte) {
		h := buildHistory(t, seed)
		out := damageJournal(t, h.text, damage)
		segs := bytes.Split(out, []byte("\n"))
		if len(segs) > 0 && len(segs[len(segs)-1]) == 0 {
			segs = segs[:len(segs)-1]
		}
		present, endSeen, forged := map[string]bool{}, map[string]bool{}, false
		for _, s := range segs {
			present[string(s)] = true
			r, err := decodeRecord(s)
			if err != nil {
				continue
			}
			switch r.Op {
			case OpSchema, OpLease, OpEnd, OpRenew:
				// A well-formed record the history never wrote: the damage
				// forged one, and what it says may change the outcome.
				forged = forged || !h.lines[string(s)]
			}
			if r.Op == OpEnd {
				endSeen[r.ID] = true
			}
		}
		rep, err := Decode(out, replayShapes())
		if err != nil {
			if !forged {
				t.Fatalf("replay failed: %v", err)
			}
			return
		}
		kept := map[string]bool{}
		taken := map[int]string{}
		for _, e := range rep.Entries {
			id := e.Lease.ID
			if endSeen[id] {
				t.Fatalf("lease %s came back though its end is recorded", id)
			}
			for _, u := range e.Lease.Units {
				if other, ok := taken[u]; ok {
					t.Fatalf("unit %d in leases %s and %s", u, other, id)
				}
				taken[u] = id
			}
			kept[id] = true
		}
		if forged {
			return
		}
		for _, id := range h.ids {
			if !h.ended[id] && present[h.grant[id]] && !kept[id] {
				t.Fatalf("lease %s lost: its grant is intact and it never ended\nskipped %+v\ndropped %+v", id, rep.Skipped, rep.Dropped)
			}
		}
	})
}
