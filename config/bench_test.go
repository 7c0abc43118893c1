package config

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkParseLargest parses a file of MaxFileSize bytes that holds as
// many quotas as allowed and profiles for the rest: what a reload of the
// largest file costs.
func BenchmarkParseLargest(b *testing.B) {
	var s strings.Builder
	s.WriteString("quotas:\n" + manyQuotas(MaxQuotas) + "profiles:\n")
	for task := 0; s.Len() < MaxFileSize-2048; task++ {
		s.WriteString("  task-" + strconv.Itoa(task) + ":\n")
		for m := 0; m < 16; m++ {
			s.WriteString("    NVIDIA H100 80GB HBM3 rev " + strconv.Itoa(m) + ": 1h2m3s\n")
		}
	}
	data := []byte(s.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMayUseGPU asks about one GPU of an 8-GPU node split into 16 pools
// of 100 users and 10 groups each, for a caller in none of them: the most
// work a request's placement asks of the Rules per GPU.
func BenchmarkMayUseGPU(b *testing.B) {
	var s strings.Builder
	s.WriteString("pools:\n")
	for p := range 16 {
		s.WriteString("  p" + strconv.Itoa(p) + ":\n    gpus: [" + strconv.Itoa(p%8) + "]\n    users: [" + seq(100, "") + ", " + seq(10, "group:") + "]\n")
	}
	gpus := make([]GPURef, 8)
	for i := range gpus {
		gpus[i] = GPURef{Index: i, UUID: "GPU-" + strconv.Itoa(i)}
	}
	f, err := Parse([]byte(s.String()))
	if err != nil {
		b.Fatal(err)
	}
	r, err := f.Resolve(gpus, anyone{})
	if err != nil {
		b.Fatal(err)
	}
	gids := []uint32{5000, 5001, 5002, 5003}
	for b.Loop() {
		if r.MayUseGPU(3, 4000, gids) {
			b.Fatal("an outsider may use a pooled GPU")
		}
	}
}
