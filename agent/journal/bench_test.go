package journal

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// BenchmarkDecode replays a journal of 10,240 one-unit ttl leases on 16 GPUs,
// as gpuletd's restart in BenchmarkMemory (test/bench) does.
func BenchmarkDecode(b *testing.B) {
	const leases, gpus = 10240, 16
	const perGPU = leases / gpus
	created := time.Date(2026, 11, 23, 12, 0, 0, 123456789, time.UTC)
	deadline := created.Add(time.Hour)
	shapes := make([]GPUShape, gpus)
	for g := range shapes {
		shapes[g] = GPUShape{UUID: fmt.Sprintf("GPU-%02d", g), UnitsTotal: perGPU, InstanceOf: func(int) int { return 0 }, UnitsPerMax: 1}
	}
	text, err := AppendRecord(nil, Record{Op: OpSchema, Schema: Schema})
	if err != nil {
		b.Fatal(err)
	}
	for i := range leases {
		g := i % gpus
		e := Entry{Lease: api.Lease{
			ID: fmt.Sprintf("l-%016x", i), GPU: api.LeaseGPU{Index: g, UUID: shapes[g].UUID}, Units: []int{i / gpus},
			Owner: api.Owner{UID: 1000, GID: 1000}, Created: created, Expires: &deadline, TTL: "1h0m0s", Binding: "ttl",
			Env: map[string]string{"CUDA_VISIBLE_DEVICES": shapes[g].UUID, "CUDA_MPS_PIPE_DIRECTORY": "/run/gpulet/mps/" + shapes[g].UUID + "/0/pipe"},
		}, Deadline: &deadline, TTLNanos: int64(time.Hour)}
		if text, err = AppendRecord(text, Record{Op: OpLease, Entry: &e}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		rep, err := Decode(text, shapes)
		if err != nil || len(rep.Entries) != leases {
			b.Fatalf("%d entries, %v", len(rep.Entries), err)
		}
	}
}
