package placement

import (
	"fmt"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// benchNode is a 16-GPU node holding 10,000 single-unit leases: 64 instances of
// 10 units per GPU (U = 640), 625 units used per GPU. What a decision costs
// must not grow with the leases held: the node view holds per-instance free
// lists and counts, never the leases themselves. Its GPUs are A100s and H100s
// by turns, so that the score policy has cards to tell apart.
func benchNode(leases int) *Node {
	n := &Node{ClientsPerInstance: 16, OneUserPerInstance: true}
	const gpus, instances, size = 16, 64, 10
	held := leases / gpus
	a100 := Card{CC: api.ComputeCapability{Major: 8}, MemoryBandwidthGBps: 2039, SMClockMHz: 1410}
	h100 := Card{CC: api.ComputeCapability{Major: 9}, MemoryBandwidthGBps: 3352, SMClockMHz: 1980}
	for gi := 0; gi < gpus; gi++ {
		g := GPU{Index: gi, UUID: fmt.Sprintf("GPU-%d", gi), Name: "NVIDIA A100-SXM4-80GB", MemoryTotalMiB: 81920, MemoryFreeMiB: 40000,
			Units: instances * size, Card: a100}
		if gi%2 == 1 {
			g.Name, g.Card = "NVIDIA H100 80GB HBM3", h100
		}
		left := held
		for k := 0; k < instances; k++ {
			in := Instance{Index: k, Size: size}
			used := min(left, size)
			left -= used
			for u := k*size + used; u < (k+1)*size; u++ {
				in.FreeUnits = append(in.FreeUnits, u)
			}
			in.Clients = used
			if used > 0 {
				in.Users = []uint32{uint32(1000 + k%3)}
			}
			g.Free += len(in.FreeUnits)
			g.Instances = append(g.Instances, in)
		}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

// BenchmarkPlace measures one decision per policy on the node with no lease
// held and with 10,000: the figures must be alike (goal: at most 20 µs).
func BenchmarkPlace(b *testing.B) {
	for _, held := range []int{0, 10000} {
		n := benchNode(held)
		for _, p := range Policies {
			e := New(p)
			b.Run(fmt.Sprintf("%s/held=%d", p, held), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := e.Place(n, Request{Units: 1, UID: 1001}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
