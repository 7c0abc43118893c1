package journal

import (
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
)

// TestDecodeJournalKeepsWholeGPULeases: a whole-GPU lease's record carries
// its GPU list and comes back with it; it holds every unit of each GPU, so a
// later lease of any of them wins, and a list that does not fit the node is
// dropped.
func TestDecodeJournalKeepsWholeGPULeases(t *testing.T) {
	model, _ := units.New(2, 4, 2, 0)
	shape := func(uuid string) GPUShape {
		return GPUShape{UUID: uuid, UnitsTotal: model.UnitsPerGPU, InstanceOf: model.InstanceOf, UnitsPerMax: 2}
	}
	shapes := []GPUShape{shape("GPU-a"), shape("GPU-b"), shape("GPU-c")}
	all := make([]int, model.UnitsPerGPU)
	for u := range all {
		all[u] = u
	}
	a, b, c := api.LeaseGPU{Index: 0, UUID: "GPU-a"}, api.LeaseGPU{Index: 1, UUID: "GPU-b"}, api.LeaseGPU{Index: 2, UUID: "GPU-c"}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	whole := func(id string, gpus ...api.LeaseGPU) *Entry {
		return &Entry{Lease: api.Lease{ID: id, GPU: gpus[0], GPUs: gpus, Units: all, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "x"}},
			Deadline: &deadline, TTLNanos: int64(time.Minute)}
	}
	kept := whole("l-000000000000000a", c, a)
	rec, err := AppendRecord(nil, Record{Op: OpLease, Entry: kept})
	if err != nil || !strings.Contains(string(rec), `"gpus":[{"index":2,"uuid":"GPU-c"},{"index":0,"uuid":"GPU-a"}]`) {
		t.Fatalf("record %s, err %v", rec, err)
	}
	short := whole("l-000000000000000b", b)
	short.Lease.Units = all[:1]
	twice := whole("l-000000000000000c", b, b)
	text := journalText(t, Record{Op: OpSchema, Schema: Schema}, Record{Op: OpLease, Entry: kept}, Record{Op: OpLease, Entry: short},
		Record{Op: OpLease, Entry: twice}, Record{Op: OpLease, Entry: whole("l-000000000000000d", b, api.LeaseGPU{Index: 3, UUID: "GPU-d"})})
	rep, err := Decode([]byte(text), shapes)
	if err != nil || len(rep.Entries) != 1 || len(rep.Dropped) != 3 {
		t.Fatalf("replay %+v, err %v", rep, err)
	}
	if got := rep.Entries[0].Lease.GPUs; len(got) != 2 || got[0] != c || got[1] != a {
		t.Fatalf("GPUs back as %v", got)
	}
	// A unit lease of GPU a granted later: the whole-GPU lease had ended.
	later := Entry{Lease: api.Lease{ID: "l-000000000000000e", GPU: a, Units: []int{3}, Created: deadline}, Deadline: &deadline, TTLNanos: int64(time.Minute)}
	rep, err = Decode([]byte(text+journalText(t, Record{Op: OpLease, Entry: &later})), shapes)
	if err != nil || len(rep.Entries) != 1 || rep.Entries[0].Lease.ID != later.Lease.ID {
		t.Fatalf("after a later lease of one of its GPUs: %+v, err %v", rep, err)
	}
}
