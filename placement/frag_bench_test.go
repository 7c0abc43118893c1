package placement

import "testing"

// BenchmarkFragDecision is one frag decision on a node of eight GPUs of
// 1000 units, partly used, with a host, over a mix of 16 shapes.
func BenchmarkFragDecision(b *testing.B) {
	n := fragNode(1000, 700, 450, 1000, 200, 1000, 880, 1000)
	n.Host = &Host{CPUMilli: 96000, MemoryMiB: 393216, CPUMilliFree: 50000, MemoryMiBFree: 200000}
	mix := &Mix{}
	for i := 0; i < 16; i++ {
		mix.Shapes = append(mix.Shapes, Shape{Units: 50 + 60*i, HostCPUMilli: uint64(2000 * (i%6 + 1)), Weight: 1.0 / 16})
	}
	mix.Shapes[15] = Shape{GPUs: 2, HostCPUMilli: 16000, Weight: 1.0 / 16}
	e := New(Frag).WithMix(mix)
	r := Request{Units: 300, HostCPUMilli: 4000, HostMemoryMiB: 8192}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := e.Place(n, r); err != nil {
			b.Fatal(err)
		}
	}
}
