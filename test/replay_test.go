package test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/collector/cluster"
	"github.com/gpulet/gpulet/placement"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestReplayModelAgreesWithGpuletd places the same 200 requests through a
// real gpuletd (simulated backend, its HTTP API) and through the node model
// gpulet-replay places on (collector/cluster), under each policy the
// daemon takes without a learned mix, and gets the same GPU and units for
// each, and the same refusals once the node is full. A second run of 200
// mixes in requests for whole GPUs, one in five, which must get the same
// GPUs.
func TestReplayModelAgreesWithGpuletd(t *testing.T) {
	for _, p := range []placement.Policy{placement.BestFit, placement.FirstFit, placement.Spread} {
		t.Run(string(p), func(t *testing.T) {
			placed, refused, _ := placeAlike(t, p, 0)
			if placed < 100 || refused == 0 {
				t.Fatalf("%d placed, %d refused: the requests should fill the node", placed, refused)
			}
		})
		t.Run(string(p)+"/whole-gpus", func(t *testing.T) {
			placed, refused, wholes := placeAlike(t, p, 5)
			if wholes == 0 || placed == wholes || refused == 0 {
				t.Fatalf("%d placed (%d of whole GPUs), %d refused: both kinds should be placed and the node filled", placed, wholes, refused)
			}
		})
	}
}

// placeAlike places 200 requests through a gpuletd and the node model under
// policy p and fails at the first that they place differently. One request in
// wholeEvery, if not 0, asks for 1 or 2 whole GPUs.
func placeAlike(t *testing.T, p placement.Policy, wholeEvery int) (placed, refused, wholes int) {
	t.Helper()
	// The node model places by units alone; gpuletd's simulated GPUs read
	// the SMs of their leased units busy, as the H100 did (docs/hardware.md),
	// so --max-utilization is set where it refuses nothing.
	d := e2e.Start(t, "--sim-gpus", "4xA100-80GB,4xT4-16GB", "--policy", string(p),
		"--units-per-client", "8", "--clients-per-instance", "16", "--units-per-gpu", "64", "--max-utilization", "100")
	ctx := e2e.Ctx(t)
	gl, err := d.Client.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := cluster.NodeSpec{Name: "e2e", Units: 64, ClientsPerInstance: 16}
	for _, g := range gl.GPUs {
		spec.GPUs = append(spec.GPUs, cluster.GPUSpec{Name: g.Name, MemoryTotalMiB: g.MemoryTotalMiB})
	}
	model := cluster.New(placement.New(p))
	if err := model.Add(spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(23, 200))
	for i := 0; i < 200; i++ {
		units, gpus := 1+rng.IntN(8), 0
		if wholeEvery > 0 && rng.IntN(wholeEvery) == 0 {
			units, gpus = 0, 1+rng.IntN(2)
		}
		l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: units, GPUs: gpus, TTL: "10m"})
		r := cluster.Request{Request: placement.Request{Units: units, GPUs: gpus}}
		a, merr := model.Place(r, 1)
		if (err == nil) != (merr == nil) {
			t.Fatalf("request %d (%d units, %d whole GPUs): gpuletd %v, the model %v", i, units, gpus, err, merr)
		}
		if err != nil {
			if !errors.Is(err, api.ErrInsufficientUnits) {
				t.Fatalf("request %d: %v", i, err)
			}
			refused++
			continue
		}
		c := a.Ranked[0].Choice
		switch {
		case gpus > 0:
			if got := gpuIndices(l.GPUs); fmt.Sprint(got) != fmt.Sprint(c.GPUs) {
				t.Fatalf("request %d (%d whole GPUs): gpuletd GPUs %v, the model %v", i, gpus, got, c.GPUs)
			}
			wholes++
		case l.GPU.Index != c.GPU || fmt.Sprint(l.Units) != fmt.Sprint(c.Units):
			t.Fatalf("request %d (%d units): gpuletd GPU %d units %v, the model GPU %d units %v", i, units, l.GPU.Index, l.Units, c.GPU, c.Units)
		}
		if err := model.Commit(r, a.Ranked[0]); err != nil {
			t.Fatal(err)
		}
		placed++
	}
	return placed, refused, wholes
}

func gpuIndices(gpus []api.LeaseGPU) []int {
	out := make([]int, len(gpus))
	for i, g := range gpus {
		out[i] = g.Index
	}
	return out
}
