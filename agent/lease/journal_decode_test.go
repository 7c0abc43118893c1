package lease

import (
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
)

func journalText(t testing.TB, recs ...record) string {
	var out []byte
	for _, r := range recs {
		b, err := encodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return string(out)
}

func TestDecodeJournalReplays(t *testing.T) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []gpuShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	later := deadline.Add(time.Hour)
	a := journalEntry{Lease: api.Lease{ID: "l-000000000000000a", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0, 1}, Owner: api.Owner{PID: 1}}, StartTime: 5}
	b := journalEntry{Lease: api.Lease{ID: "l-000000000000000b", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{2}}, Deadline: &deadline, TTLNanos: int64(time.Minute)}
	c := journalEntry{Lease: api.Lease{ID: "l-000000000000000c", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{1}, Owner: api.Owner{PID: 2}}, StartTime: 6}
	text := journalText(t,
		record{Op: opSchema, Schema: JournalSchema},
		record{Op: opLease, Entry: &a},
		record{Op: opLease, Entry: &b},
		record{Op: opRenew, ID: b.Lease.ID, Deadline: &later},
		// c shares unit 1 with a: granted after it, so a had ended.
		record{Op: opLease, Entry: &c},
	)
	rep, err := decodeJournal([]byte(text), shapes)
	if err != nil || len(rep.entries) != 2 || rep.entries[0].Lease.ID != b.Lease.ID || !rep.entries[0].Deadline.Equal(later) ||
		len(rep.dropped) != 1 || rep.dropped[0].Lease != a.Lease.ID || rep.dropped[0].Record != 2 {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
	// An end removes a (so c's unit is its own again); a damaged record is
	// skipped and named, and the records after it still count.
	text2 := text + journalText(t, record{Op: opEnd, ID: a.Lease.ID}) + "deadbeef {\"op\":\"end\",\"id\":\"" + b.Lease.ID + "\"}\n" +
		journalText(t, record{Op: opRenew, ID: b.Lease.ID, Deadline: &deadline})
	rep, err = decodeJournal([]byte(text2), shapes)
	if err != nil || len(rep.entries) != 2 || rep.entries[0].Lease.ID != b.Lease.ID || rep.entries[1].Lease.ID != c.Lease.ID ||
		!rep.entries[0].Deadline.Equal(deadline) || len(rep.skipped) != 1 || rep.skipped[0].Record != 7 || rep.skipped[0].Lease != b.Lease.ID {
		t.Fatalf("after end and damage: %+v %v", rep, err)
	}
}

func FuzzDecodeJournal(f *testing.F) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []gpuShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	e := journalEntry{Lease: api.Lease{ID: "l-0123456789abcdef", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0, 1}, Owner: api.Owner{PID: 1}}, StartTime: 5}
	good := journalText(f, record{Op: opSchema, Schema: JournalSchema}, record{Op: opLease, Entry: &e}, record{Op: opEnd, ID: e.Lease.ID})
	p := journalEntry{Lease: api.Lease{ID: "l-0123456789abcde0", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{2, 3, 4}, Binding: "pod", Pod: &api.LeasePod{Devices: []string{"d"}}}}
	pod := journalText(f, record{Op: opSchema, Schema: JournalSchema}, record{Op: opLease, Entry: &p})
	for _, s := range []string{good, good[:len(good)/2], "", "x", "00000000 {}\n", pod} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		rep, _ := decodeJournal([]byte(b), shapes)
		seen := map[int]bool{}
		for _, e := range rep.entries {
			most := 2
			if e.Lease.Binding == "pod" {
				most = model.UnitsPerGPU
			}
			if !validID(e.Lease.ID) || e.Lease.GPU.UUID != "GPU-a" || len(e.Lease.Units) == 0 || len(e.Lease.Units) > most {
				t.Fatalf("accepted a bad entry %+v", e)
			}
			for _, u := range e.Lease.Units {
				if seen[u] || u < 0 || u >= model.UnitsPerGPU || model.InstanceOf(u) != e.Lease.Instance {
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
	shapes := []gpuShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 1}}
	e := journalEntry{Lease: api.Lease{ID: "l-000000000000000d", GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: []int{0}, Owner: api.Owner{PID: 7}}}
	rep, err := decodeJournal([]byte(journalText(t, record{Op: opSchema, Schema: JournalSchema}, record{Op: opLease, Entry: &e})), shapes)
	if err != nil || len(rep.entries) != 0 || len(rep.dropped) != 1 || !strings.Contains(rep.dropped[0].Why, "start time") {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
}

// A pod lease is bound to neither a process nor a deadline, and may hold
// more than M units (rebuilt from what a container holds); one that names a
// process or a deadline is damaged.
func TestReplayOfPodLeases(t *testing.T) {
	model, _ := units.New(2, 4, 2, 0)
	shapes := []gpuShape{{UUID: "GPU-a", UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(id string, units []int) api.Lease {
		return api.Lease{ID: id, GPU: api.LeaseGPU{UUID: "GPU-a"}, Units: units, Binding: "pod", Pod: &api.LeasePod{Devices: []string{"GPU-a-0"}}}
	}
	big := journalEntry{Lease: pod("l-00000000000000a1", []int{0, 1, 2})}
	withPID := journalEntry{Lease: pod("l-00000000000000a2", []int{3}), StartTime: 5}
	withPID.Lease.Owner.PID = 9
	withDeadline := journalEntry{Lease: pod("l-00000000000000a3", []int{4}), Deadline: &deadline, TTLNanos: int64(time.Minute)}
	rep, err := decodeJournal([]byte(journalText(t, record{Op: opSchema, Schema: JournalSchema},
		record{Op: opLease, Entry: &big}, record{Op: opLease, Entry: &withPID}, record{Op: opLease, Entry: &withDeadline})), shapes)
	if err != nil || len(rep.entries) != 1 || rep.entries[0].Lease.ID != big.Lease.ID || rep.entries[0].Lease.Pod.Devices[0] != "GPU-a-0" || len(rep.dropped) != 2 {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
	for _, d := range rep.dropped {
		if !strings.Contains(d.Why, "pod lease with a process or a deadline") {
			t.Fatalf("dropped %+v", d)
		}
	}
}
