package journal

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// FuzzLeaseJSONIsWhatJSONMakes holds the hand-made lease encoding to
// encoding/json's bytes, for any text, numbers and times a lease may carry,
// and checks that what it leaves to encoding/json is what it says it leaves.
func FuzzLeaseJSONIsWhatJSONMakes(f *testing.F) {
	f.Add("l-0123456789abcdef", "GPU-x", "train", "CUDA_MPS_PIPE_DIRECTORY", "/run/gpulet/mps/GPU-x/0/pipe", "1m0s", "ttl", 3, int64(1795400000), int64(1795400060), uint64(0), byte(0))
	f.Add("", "", "", "", "", "", "", 0, int64(0), int64(0), uint64(0), byte(0xff))
	f.Add("a \"b\" <c> & d", "ü\xff", "\u2028x", "\x00", "\\", "x\ty", "pid", -7, int64(-1), int64(-1), uint64(1)<<63, byte(0x5a))
	f.Add("id", "GPU-y", "t", "K", "V", "", "", 1, int64(300000*365*24*3600), int64(1), uint64(512), byte(3))
	f.Fuzz(func(t *testing.T, id, uuid, task, key, value, ttl, binding string, n int, created, expires int64, mem uint64, shape byte) {
		// Times in seconds since 1970 reach years encoding/json refuses.
		at := func(sec int64) time.Time { return time.Unix(sec, int64(n)%1e9) }
		zones := []*time.Location{time.UTC, time.FixedZone("x", -7*3600-30*60), time.FixedZone("", 14*3600)}
		l := api.Lease{
			ID: id, GPU: api.LeaseGPU{Index: n, UUID: uuid}, Instance: -n, Units: []int{n, n + 1},
			Owner:   api.Owner{UID: uint32(mem), GID: uint32(mem >> 32), PID: n},
			Created: at(created).In(zones[int(shape)%len(zones)]),
			TTL:     ttl, Binding: binding, Preemptible: shape&1 != 0, Reservation: value, Task: task, MemoryMiB: mem,
			Env: map[string]string{key: value, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": ttl},
		}
		if shape&2 != 0 {
			exp := at(expires)
			l.Expires = &exp
		}
		if shape&4 != 0 {
			l.Units = nil
		}
		if shape&8 != 0 {
			l.Env = nil
		}
		if shape&16 != 0 {
			l.Owner.Groups = []uint32{uint32(n), 0, uint32(mem)}
		}
		if shape&32 != 0 {
			l.Labels = map[string]string{key: value}
		}
		if shape&64 != 0 {
			l.Pod = &api.LeasePod{Devices: []string{uuid}}
		}
		want, err := json.Marshal(&l)
		got, ok := AppendLease(nil, &l)
		if !ok {
			if len(got) != 0 {
				t.Fatalf("appended %q though it left the lease to encoding/json", got)
			}
			if err == nil && len(l.Labels) == 0 && l.Pod == nil {
				t.Fatalf("left to encoding/json a lease it encodes: %s", want)
			}
			return
		}
		if err != nil {
			t.Fatalf("encoded %s where encoding/json refuses: %v", got, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("hand-made\n%s\ndiffers from encoding/json's\n%s", got, want)
		}
	})
}

// FuzzEndAndRenewRecordsAreWhatJSONMakes holds the hand-made end and renewal
// records to encoding/json's bytes.
func FuzzEndAndRenewRecordsAreWhatJSONMakes(f *testing.F) {
	f.Add("l-0123456789abcdef", int64(1795400000), int64(5))
	f.Add("", int64(-62135596801), int64(0))
	f.Add("a\"<\xff\u2028", int64(253402300800), int64(-1))
	f.Fuzz(func(t *testing.T, id string, sec, nsec int64) {
		d := time.Unix(sec, nsec)
		for _, r := range []Record{{Op: OpEnd, ID: id}, {Op: OpRenew, ID: id, Deadline: &d}} {
			want, err := json.Marshal(r)
			got, ok := appendRecordJSON(nil, r)
			switch {
			case !ok && err == nil && r.Op == OpEnd:
				t.Fatalf("left an end record to encoding/json: %s", want)
			case !ok:
				continue
			case err != nil:
				t.Fatalf("encoded %s where encoding/json refuses: %v", got, err)
			case !bytes.Equal(got, want):
				t.Fatalf("hand-made\n%s\ndiffers from encoding/json's\n%s", got, want)
			}
		}
	})
}
