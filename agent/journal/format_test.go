package journal

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// goldenRecords are the records of testdata/v2.journal: one of each shape the
// lease engine writes, the hand-encoded and those left to encoding/json.
func goldenRecords() []Record {
	created := time.Date(2026, 11, 23, 12, 0, 0, 123456789, time.UTC)
	deadline := created.Add(90 * time.Second)
	whole := time.Date(2026, 11, 23, 12, 5, 0, 0, time.FixedZone("", 3600))
	env := map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
	pidLease := api.Lease{ID: "l-0123456789abcdef", GPU: api.LeaseGPU{Index: 1, UUID: "GPU-x"}, Instance: 2, Units: []int{8, 9},
		Owner: api.Owner{UID: 1000, GID: 1000, PID: 4242, Groups: []uint32{27, 1001}}, Created: created, Binding: "pid", Env: env}
	ttlLease := api.Lease{ID: "l-00000000000000a1", GPU: api.LeaseGPU{UUID: "GPU-y"}, Units: []int{0}, Owner: api.Owner{UID: 1, GID: 2},
		Created: created, Expires: &deadline, TTL: "1m30s", Binding: "ttl", Preemptible: true, Reservation: "wf1", Task: "train <a&b>", MemoryMiB: 4096, Env: env}
	labelled := api.Lease{ID: "l-00000000000000a2", GPU: api.LeaseGPU{UUID: "GPU-y"}, Units: []int{1}, Owner: api.Owner{PID: 7}, Created: whole,
		Binding: "pid", Labels: map[string]string{"job": `a "quoted" \ tag`, "ünï": "ç\u2028"}}
	podLease := api.Lease{ID: "l-00000000000000a3", GPU: api.LeaseGPU{UUID: "GPU-y"}, Units: []int{2, 3}, Created: created, Binding: "pod",
		Pod: &api.LeasePod{Devices: []string{"GPU-y-2", "GPU-y-3"}, Namespace: "ns", Name: "p", Container: "c"}}
	slurmLease := api.Lease{ID: "l-00000000000000a4", GPU: api.LeaseGPU{UUID: "GPU-y"}, Units: []int{4}, Created: created, Binding: "slurm",
		Slurm: &api.LeaseSlurm{JobID: 77, Step: "batch"}}
	noEnv := api.Lease{ID: "l-00000000000000a5", GPU: api.LeaseGPU{UUID: "GPU-y"}, Created: created}
	later := whole.Add(time.Hour)
	return []Record{
		{Op: OpSchema, Schema: Schema},
		{Op: OpLease, Entry: &Entry{Lease: pidLease, StartTime: 987654321}},
		{Op: OpLease, Entry: &Entry{Lease: ttlLease, Deadline: &deadline, TTLNanos: int64(90 * time.Second), Share: "group:ml"}},
		{Op: OpLease, Entry: &Entry{Lease: labelled, StartTime: 1}},
		{Op: OpLease, Entry: &Entry{Lease: podLease}},
		{Op: OpLease, Entry: &Entry{Lease: slurmLease, SlurmCgroup: "/sys/fs/cgroup/slurm/job_77"}},
		{Op: OpLease, Entry: &Entry{Lease: noEnv, StartTime: 3}},
		{Op: OpRenew, ID: ttlLease.ID, Deadline: &later},
		{Op: OpEnd, ID: pidLease.ID, PeakMemoryMiB: 1234},
		{Op: OpEnd, ID: labelled.ID},
	}
}

// TestFormatIsV2 holds the encoder to the bytes of testdata/v2.journal, which
// the encoder wrote when the journal was part of the lease engine: a journal
// written before an upgrade is replayed after it, so not one byte may move.
// The decoder reads each record back as it was.
func TestFormatIsV2(t *testing.T) {
	want, err := os.ReadFile("testdata/v2.journal")
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, r := range goldenRecords() {
		if got, err = AppendRecord(got, r); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the encoder writes\n%s\nwhere the journal's format is\n%s", got, want)
	}
	for i, line := range bytes.SplitAfter(want, []byte("\n"))[:len(goldenRecords())] {
		r, err := decodeRecord(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil {
			t.Fatalf("record %d: %v", i+1, err)
		}
		again, err := AppendRecord(nil, r)
		if err != nil || !bytes.Equal(again, line) {
			t.Fatalf("record %d decoded and encoded again:\n%s\nwant\n%s (%v)", i+1, again, line, err)
		}
	}
}
