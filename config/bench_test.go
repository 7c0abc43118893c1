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
