package test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestFragLearnsTheMix is the worked example of docs/placement.md at U = 10:
// GPU 0 has 4 units free, GPU 1 has 6, and the node has been receiving as many
// requests of 2 units as of 4. A request of 2 goes to GPU 1 under --policy frag,
// which leaves both GPUs able to take a request of 4, where best-fit takes the
// tighter GPU 0 and leaves 2 units no request of 4 can use.
func TestFragLearnsTheMix(t *testing.T) {
	place := func(policy string) int {
		// --max-utilization 100: the simulated GPUs read busy as their
		// leased share (docs/hardware.md), and a sample that caught GPU 0's
		// units all leased would take it out of placement above the default
		// 90%, which this test is not about.
		d := e2e.Start(t, "--sim-gpus", "2xT4", "--units-per-gpu", "10", "--policy", policy, "--max-utilization", "100")
		ctx := e2e.Ctx(t)
		for gpu, units := range map[string]int{"0": 6, "1": 4} {
			if _, err := d.Client.Lease(ctx, api.LeaseRequest{Units: units, GPU: gpu, TTL: "5m"}); err != nil {
				t.Fatal(err)
			}
		}
		// Enough requests for the learner to publish a mix of them (it does
		// every 32).
		for i := range 64 {
			l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 2 + 2*(i%2), TTL: "5m"})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Client.Release(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 2, TTL: "5m"})
		if err != nil {
			t.Fatal(err)
		}
		return l.GPU.Index
	}
	if got := place("best-fit"); got != 0 {
		t.Fatalf("best-fit put the request of 2 on GPU %d, want the tighter GPU 0", got)
	}
	if got := place("frag"); got != 1 {
		t.Fatalf("frag put the request of 2 on GPU %d, want GPU 1, which leaves no hole a request of 4 cannot use", got)
	}
}

// TestRefusedRequestsDoNotSteerFrag: a flood of lease requests that can
// never fit (12 units and more memory than any GPU has), all refused,
// teaches --policy frag nothing. Without it, four 4-unit leases pack onto
// one GPU and a whole GPU is left for a request of one; counted, the flood
// made frag keep 12 units free on every GPU, spreading the four over four
// GPUs and refusing the whole GPU.
func TestRefusedRequestsDoNotSteerFrag(t *testing.T) {
	place := func(flood bool) string {
		d := e2e.Start(t, "--sim-gpus", "4xA100-80GB", "--units-per-gpu", "16", "--policy", "frag")
		ctx := e2e.Ctx(t)
		if flood {
			for range 1024 {
				_, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 12, MemoryMiB: 1e12, TTL: "5m"})
				if !errors.Is(err, api.ErrInsufficientUnits) {
					t.Fatalf("a request of more memory than any GPU has: %v, want refused", err)
				}
			}
		}
		var got []string
		for range 4 {
			l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 4, TTL: "5m"})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprint("GPU ", l.GPU.Index))
		}
		if _, err := d.Client.Lease(ctx, api.LeaseRequest{GPUs: 1, TTL: "5m"}); err != nil {
			got = append(got, "whole GPU refused: "+err.Error())
		}
		return strings.Join(got, ", ")
	}
	want := place(false)
	if want != "GPU 0, GPU 0, GPU 0, GPU 0" {
		t.Fatalf("without the flood: %s, want the four leases packed and the whole GPU granted", want)
	}
	if got := place(true); got != want {
		t.Fatalf("after 1,024 refused requests: %s, want as without them: %s", got, want)
	}
}
