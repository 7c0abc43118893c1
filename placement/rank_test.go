package placement

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestRankIsPlaceWithoutUnits: Rank decides as Place does, under every
// policy, with the chosen units left out; its memo, reused for requests on
// one node and reset when the node changes, changes no decision.
func TestRankIsPlaceWithoutUnits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	mix := &Mix{Shapes: []Shape{{Units: 200, Weight: 0.3}, {Units: 500, Weight: 0.3}, {GPUs: 1, Weight: 0.2}, {Units: 100, HostCPUMilli: 8000, Weight: 0.2}}}
	for _, p := range Policies {
		e := New(p).WithMix(mix)
		for range 200 {
			free := make([]int, 1+rng.IntN(8))
			for i := range free {
				free[i] = rng.IntN(1001)
			}
			n := fragNode(free...)
			if rng.IntN(2) == 0 {
				n.Host = &Host{CPUMilli: 32000, CPUMilliFree: uint64(rng.IntN(32001)), MemoryMiB: 65536, MemoryMiBFree: uint64(rng.IntN(65537))}
			}
			var memo Memo
			for range 4 {
				r := Request{Units: rng.IntN(1001), HostCPUMilli: uint64(rng.IntN(4) * 4000)}
				if rng.IntN(5) == 0 {
					r = Request{GPUs: 1 + rng.IntN(2)}
				}
				want, wantErr := e.Place(n, r)
				got, err := e.Rank(n, r, &memo)
				if (err == nil) != (wantErr == nil) {
					t.Fatalf("%s on %v, %+v: Place %v, Rank %v", p, free, r, wantErr, err)
				}
				if err != nil {
					continue
				}
				if r.GPUs == 0 && got.Choice.Units != nil {
					t.Fatalf("%s: Rank listed units %v", p, got.Choice.Units)
				}
				want.Choice.Units, got.Choice.Units = nil, nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s on %v, %+v:\nRank  %+v\nPlace %+v", p, free, r, got, want)
				}
			}
			// The node changes: a reset memo sees the change.
			memo.Reset()
			for gi := range n.GPUs {
				g := &n.GPUs[gi]
				g.Free /= 2
				g.Instances[0].FreeUnits = g.Instances[0].FreeUnits[:g.Free]
			}
			r := Request{Units: 1 + rng.IntN(100)}
			want, wantErr := e.Place(n, r)
			got, err := e.Rank(n, r, &memo)
			if (err == nil) != (wantErr == nil) || err == nil && (got.Best != want.Best || got.Choice.GPU != want.Choice.GPU) {
				t.Fatalf("%s after a change: Rank %+v %v, Place %+v %v", p, got, err, want, wantErr)
			}
		}
	}
}
