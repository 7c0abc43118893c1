package placement

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// TestUnitsShareMustBeFree: a request that asks no memory gets its units'
// share as its limit, so that much must be free; a full GPU still says its
// units are full.
func TestUnitsShareMustBeFree(t *testing.T) {
	n := testNode()
	n.GPUs[1].Unusable, n.GPUs[2].Unusable = "failed", "failed"
	n.GPUs[0].MemoryFreeMiB = 2*5120 - 1
	e := New(BestFit)
	if _, err := e.Place(n, Request{Units: 1}); err != nil {
		t.Fatalf("one unit's share (5120 MiB) with 10239 free: %v", err)
	}
	_, err := e.Place(n, Request{Units: 2})
	if !errors.Is(err, api.ErrInsufficientUnits) || errors.Is(err, ErrNeverFits) || !strings.Contains(err.Error(), "GPU 0 has 10239 MiB free, less than the units' share of 10240 MiB") {
		t.Fatalf("two units' share with 10239 free: %v", err)
	}
	n.GPUs[0].Free = 0
	for k := range n.GPUs[0].Instances {
		n.GPUs[0].Instances[k].FreeUnits = nil
	}
	if _, err := e.Place(n, Request{Units: 2}); err == nil || !strings.Contains(err.Error(), "GPU 0 has 0 unit(s) free") {
		t.Fatalf("a full GPU: %v", err)
	}
}
