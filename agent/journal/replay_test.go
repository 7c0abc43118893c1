package journal

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
)

func journalText(t testing.TB, recs ...Record) string {
	var out []byte
	for _, r := range recs {
		b, err := AppendRecord(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return string(out)
}

func TestDecodeJournalReplays(t *testing.T) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []GPUShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	later := deadline.Add(time.Hour)
	a := Entry{Lease: api.Lease{ID: "l-000000000000000a", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0, 1}, Owner: api.Owner{PID: 1}}, StartTime: 5}
	b := Entry{Lease: api.Lease{ID: "l-000000000000000b", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{2}}, Deadline: &deadline, TTLNanos: int64(time.Minute)}
	c := Entry{Lease: api.Lease{ID: "l-000000000000000c", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{1}, Owner: api.Owner{PID: 2}}, StartTime: 6}
	text := journalText(t,
		Record{Op: OpSchema, Schema: Schema},
		Record{Op: OpLease, Entry: &a},
		Record{Op: OpLease, Entry: &b},
		Record{Op: OpRenew, ID: b.Lease.ID, Deadline: &later},
		// c shares unit 1 with a: granted after it, so a had ended.
		Record{Op: OpLease, Entry: &c},
	)
	rep, err := Decode([]byte(text), shapes)
	if err != nil || len(rep.Entries) != 2 || rep.Entries[0].Lease.ID != b.Lease.ID || !rep.Entries[0].Deadline.Equal(later) ||
		len(rep.Dropped) != 1 || rep.Dropped[0].Lease != a.Lease.ID || rep.Dropped[0].Record != 2 {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
	// An end removes a (so c's unit is its own again); a damaged record is
	// skipped and named, and the records after it still count.
	text2 := text + journalText(t, Record{Op: OpEnd, ID: a.Lease.ID}) + "deadbeef {\"op\":\"end\",\"id\":\"" + b.Lease.ID + "\"}\n" +
		journalText(t, Record{Op: OpRenew, ID: b.Lease.ID, Deadline: &deadline})
	rep, err = Decode([]byte(text2), shapes)
	if err != nil || len(rep.Entries) != 2 || rep.Entries[0].Lease.ID != b.Lease.ID || rep.Entries[1].Lease.ID != c.Lease.ID ||
		!rep.Entries[0].Deadline.Equal(deadline) || len(rep.Skipped) != 1 || rep.Skipped[0].Record != 7 || rep.Skipped[0].Lease != b.Lease.ID {
		t.Fatalf("after end and damage: %+v %v", rep, err)
	}
}

func FuzzDecodeJournal(f *testing.F) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []GPUShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	e := Entry{Lease: api.Lease{ID: "l-0123456789abcdef", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0, 1}, Owner: api.Owner{PID: 1}}, StartTime: 5}
	good := journalText(f, Record{Op: OpSchema, Schema: Schema}, Record{Op: OpLease, Entry: &e}, Record{Op: OpEnd, ID: e.Lease.ID})
	p := Entry{Lease: api.Lease{ID: "l-0123456789abcde0", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{2, 3, 4}, Binding: "pod", Pod: &api.LeasePod{Devices: []string{"d"}}}}
	pod := journalText(f, Record{Op: OpSchema, Schema: Schema}, Record{Op: OpLease, Entry: &p})
	all := make([]int, model.UnitsPerGPU)
	for u := range all {
		all[u] = u
	}
	w := Entry{Lease: api.Lease{ID: "l-0123456789abcde1", GPU: api.LeaseGPU{UUID: "GPU-a"}, GPUs: []api.LeaseGPU{{UUID: "GPU-a"}}, Units: all, Owner: api.Owner{PID: 1}}, StartTime: 5}
	whole := journalText(f, Record{Op: OpSchema, Schema: Schema}, Record{Op: OpLease, Entry: &w})
	for _, s := range []string{good, good[:len(good)/2], "", "x", "00000000 {}\n", pod, whole} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		rep, _ := Decode([]byte(b), shapes)
		seen := map[int]bool{}
		for _, e := range rep.Entries {
			most := 2
			whole := len(e.Lease.GPUs) > 0
			if e.Lease.Binding == "pod" || whole {
				most = model.UnitsPerGPU
			}
			if !ValidID(e.Lease.ID) || e.Lease.GPU.UUID != "GPU-a" || len(e.Lease.Units) == 0 || len(e.Lease.Units) > most {
				t.Fatalf("accepted a bad entry %+v", e)
			}
			for _, u := range e.Lease.Units {
				if seen[u] || u < 0 || u >= model.UnitsPerGPU || !whole && model.InstanceOf(u) != e.Lease.Instance {
					t.Fatalf("accepted unit %d twice or out of place", u)
				}
				seen[u] = true
			}
		}
	})
}

// A process-bound lease without its process's start time is dropped at
// replay: it would be bound to whichever process had the pid by then.
func TestReplayDropsAProcessLeaseWithoutStartTime(t *testing.T) {
	model, _ := units.New(1, 4, 1, 0)
	shapes := []GPUShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 1}}
	e := Entry{Lease: api.Lease{ID: "l-000000000000000d", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0}, Owner: api.Owner{PID: 7}}}
	rep, err := Decode([]byte(journalText(t, Record{Op: OpSchema, Schema: Schema}, Record{Op: OpLease, Entry: &e})), shapes)
	if err != nil || len(rep.Entries) != 0 || len(rep.Dropped) != 1 || !strings.Contains(rep.Dropped[0].Why, "start time") {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
}

// A pod lease is bound to neither a process nor a deadline, and may hold
// more than M units (rebuilt from what a container holds); one that names a
// process or a deadline is damaged.
func TestReplayOfPodLeases(t *testing.T) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []GPUShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(id string, units []int) api.Lease {
		return api.Lease{ID: id, GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: units, Binding: "pod", Pod: &api.LeasePod{Devices: []string{"GPU-a-0"}}}
	}
	big := Entry{Lease: pod("l-00000000000000a1", []int{0, 1, 2})}
	withPID := Entry{Lease: pod("l-00000000000000a2", []int{3}), StartTime: 5}
	withPID.Lease.Owner.PID = 9
	withDeadline := Entry{Lease: pod("l-00000000000000a3", []int{4}), Deadline: &deadline, TTLNanos: int64(time.Minute)}
	rep, err := Decode([]byte(journalText(t, Record{Op: OpSchema, Schema: Schema},
		Record{Op: OpLease, Entry: &big}, Record{Op: OpLease, Entry: &withPID}, Record{Op: OpLease, Entry: &withDeadline})), shapes)
	if err != nil || len(rep.Entries) != 1 || rep.Entries[0].Lease.ID != big.Lease.ID || rep.Entries[0].Lease.Pod.Devices[0] != "GPU-a-0" || len(rep.Dropped) != 2 {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
	for _, d := range rep.Dropped {
		if !strings.Contains(d.Why, "pod lease with a process or a deadline") {
			t.Fatalf("dropped %+v", d)
		}
	}
}

// TestEndWinsWhereverItStands: an end record before its lease's grant, or a
// grant after the end, never brings the lease back; and the log-free parts of
// the replay hold for an empty and a schema-only journal.
func TestEndWinsWhereverItStands(t *testing.T) {
	shapes, entries := replayShapes(), replayLeases()
	a, b := entries[0], entries[1]
	schema := Record{Op: OpSchema, Schema: Schema}
	tests := []struct {
		name string
		recs []Record
		want []string
	}{
		{"end after grant", []Record{schema, {Op: OpLease, Entry: &a}, {Op: OpEnd, ID: a.Lease.ID}, {Op: OpLease, Entry: &b}}, []string{b.Lease.ID}},
		{"end before grant", []Record{schema, {Op: OpEnd, ID: a.Lease.ID}, {Op: OpLease, Entry: &a}, {Op: OpLease, Entry: &b}}, []string{b.Lease.ID}},
		{"renewal after end", []Record{schema, {Op: OpLease, Entry: &a}, {Op: OpEnd, ID: a.Lease.ID}, {Op: OpRenew, ID: a.Lease.ID, Deadline: b.Deadline}}, nil},
		{"no schema record", []Record{{Op: OpLease, Entry: &a}}, []string{a.Lease.ID}},
		{"schema only", []Record{schema}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Decode([]byte(journalText(t, tc.recs...)), shapes)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range rep.Entries {
				got = append(got, e.Lease.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v (%+v)", got, tc.want, rep)
			}
		})
	}
	if _, err := Decode([]byte(journalText(t, Record{Op: OpSchema, Schema: "gpulet.journal/v9"})), shapes); err == nil {
		t.Fatal("a journal of another format was replayed")
	}
}

// replayShapes is the node replay tests check leases against: one GPU of 16
// units in two instances, two units at most per lease.
func replayShapes() []GPUShape {
	return []GPUShape{{UUID: "GPU-a", UnitsTotal: 16, InstanceOf: func(u int) int { return u / 8 }, UnitsPerMax: 2}}
}

// replayLeases is two leases that fit replayShapes, one of each binding.
func replayLeases() []Entry {
	created := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	deadline := created.Add(time.Hour)
	return []Entry{
		{Lease: api.Lease{ID: "l-00000000000000aa", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0}, Owner: api.Owner{PID: 7}, Created: created}, StartTime: 9},
		{Lease: api.Lease{ID: "l-00000000000000bb", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{1}, Created: created, Expires: &deadline, TTL: "1h0m0s"}, Deadline: &deadline, TTLNanos: int64(time.Hour)},
	}
}
