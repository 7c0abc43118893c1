package placement

import (
	"fmt"
	"testing"
)

// benchPools are 50 pools over the 16 GPUs of benchNode, each naming 20
// users and 5 groups, as a large site's config might.
func benchPools() []Pool {
	ps := make([]Pool, 50)
	for i := range ps {
		p := Pool{Name: fmt.Sprintf("pool%02d", i), GPUs: []int{i % 16, (i + 5) % 16}}
		for u := 0; u < 20; u++ {
			p.UIDs = append(p.UIDs, uint32(2000+i*20+u))
		}
		for g := 0; g < 5; g++ {
			p.GIDs = append(p.GIDs, uint32(5000+i*5+g))
		}
		ps[i] = p
	}
	return ps
}

// BenchmarkPlaceWithPools is BenchmarkPlace with 50 pools configured, for a
// caller in 5 groups who may use some of them, and with a task preference:
// a decision must stay within the same bound, whatever the leases held.
func BenchmarkPlaceWithPools(b *testing.B) {
	req := Request{Units: 1, UID: 1001, GIDs: []uint32{1001, 5003, 5017, 5100, 5201},
		Prefer: []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}}
	for _, held := range []int{0, 10000} {
		n := benchNode(held)
		for _, p := range Policies {
			e := New(p).WithPools(benchPools())
			b.Run(fmt.Sprintf("%s/held=%d", p, held), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := e.Place(n, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
