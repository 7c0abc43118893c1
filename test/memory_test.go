package test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestMemoryAskedIsHeld: on one simulated A100 80 GB, three leases of one
// unit and 60 GiB each. The first holds its 60 GiB, used or not, so the
// second and third are refused for memory; the snapshot and gpulet status
// show what is held; a request that waits gets the memory once the first
// lease ends.
func TestMemoryAskedIsHeld(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xA100-80GB")
	ctx := e2e.Ctx(t)
	req := api.LeaseRequest{Units: 1, MemoryMiB: 61440, TTL: "10m"}
	first, err := d.Client.Lease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		l, err := d.Client.Lease(ctx, req)
		if !errors.Is(err, client.ErrInsufficientUnits) || !strings.Contains(err.Error(), "20480 MiB free, less than the 61440 MiB asked") {
			t.Fatalf("lease %d of 60 GiB beside one held: %+v, %v", i, l, err)
		}
	}
	s, err := d.Client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := s.GPUs[0]; g.MemoryHeldMiB != 61440 || g.UnitsUsed != 1 {
		t.Fatalf("snapshot: %d unit(s) used, %d MiB held, want 1 and 61440", g.UnitsUsed, g.MemoryHeldMiB)
	}
	out, code := gpulet(t, d, "status")
	if code != 0 || !strings.Contains(out, "/61440/81920") {
		t.Fatalf("gpulet status (exit %d) does not show the held memory:\n%s", code, out)
	}
	waited := make(chan error, 1)
	go func() {
		w := req
		w.Wait = "30s"
		_, err := d.Client.Lease(ctx, w)
		waited <- err
	}()
	// Let the request queue behind the first lease; the unit test
	// (agent/lease) holds that a queued one is served.
	time.Sleep(300 * time.Millisecond)
	if err := d.Client.Release(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting 60 GiB lease once the first ended: %v", err)
	}
}
