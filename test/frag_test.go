package test

import (
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
		d := e2e.Start(t, "--sim-gpus", "2xT4", "--units-per-gpu", "10", "--policy", policy)
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
