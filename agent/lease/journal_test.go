package lease

import (
	"bytes"
	"encoding/json"
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
	roundSecond := timed
	d2 := deadline.Truncate(time.Second)
	for name, e := range map[string]journalEntry{
		"process-bound": {Lease: base, StartTime: 987654321},
		"time-bound":    {Lease: timed, Deadline: &deadline, TTLNanos: int64(90 * time.Second)},
		"whole seconds": {Lease: roundSecond, Deadline: &d2, TTLNanos: int64(time.Minute)},
		"labels":        {Lease: labelled, StartTime: 1},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := encodeRecord(record{Op: opLease, Entry: &e})
			if err != nil {
				t.Fatal(err)
			}
			if e.leaseJSON, err = json.Marshal(e.Lease); err != nil {
				t.Fatal(err)
			}
			got, err := encodeRecord(record{Op: opLease, Entry: &e})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("assembled record\n%s\ndiffers from encoding/json's\n%s", got, want)
			}
			r, err := decodeRecord(bytes.TrimSuffix(got, []byte("\n")))
			if err != nil || r.Entry == nil || r.Entry.Lease.ID != e.Lease.ID {
				t.Fatalf("decoding the assembled record: %+v, %v", r, err)
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
		e := journalEntry{Lease: l, StartTime: start}
		if ttl > 0 && ttl <= int64(maxTTL) {
			d := created.Add(time.Duration(ttl))
			e.Deadline, e.TTLNanos = &d, ttl
		}
		want, err := encodeRecord(record{Op: opLease, Entry: &e})
		if err != nil {
			t.Skip(err)
		}
		if e.leaseJSON, err = json.Marshal(e.Lease); err != nil {
			t.Fatal(err)
		}
		got, err := encodeRecord(record{Op: opLease, Entry: &e})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("assembled record\n%s\ndiffers from encoding/json's\n%s (%v)", got, want, err)
		}
	})
}
