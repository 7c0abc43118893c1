package inventory

import (
	"log/slog"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/api"
)

// TestBackendsAnswerThroughTheInterface: what the agent asks of a backend
// (its simulator controls, the compute mode, the fault watch) is asked of
// Inventory, never of a concrete backend.
func TestBackendsAnswerThroughTheInterface(t *testing.T) {
	var sim Inventory = NewSim("n", []Model{Models[0]})
	ctl := sim.Simulator()
	if ctl == nil {
		t.Fatal("the simulated backend has no Simulator")
	}
	pct := 42
	if err := ctl.Set(0, api.SimGPUUpdate{UtilizationPct: &pct}); err != nil {
		t.Fatal(err)
	}
	if got := sim.Sample(0, Load{UnitsTotal: 4}); got.UtilizationPct != 42 {
		t.Fatalf("after Set through the Simulator: utilization %d, want 42", got.UtilizationPct)
	}
	if m, err := sim.ComputeMode(0); err != nil || m != nvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("simulated compute mode %v, %v", m, err)
	}
	sim.OnFault(func() { t.Error("the simulated backend called OnFault") })
	xid := uint64(79)
	if err := ctl.Set(0, api.SimGPUUpdate{Xid: &xid}); err != nil {
		t.Fatal(err)
	}
	if got := sim.Sample(0, Load{UnitsTotal: 4}); got.Xid != 79 {
		t.Fatalf("a latched Xid is seen at the sample: %+v", got)
	}

	s, _ := newMockServer(t)
	nv, err := NewNVML(s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var hw Inventory = nv
	defer hw.Close()
	if hw.Simulator() != nil {
		t.Fatal("NVML has a Simulator")
	}
	if m, err := hw.ComputeMode(3); err != nil || m != nvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("NVML compute mode %v, %v", m, err)
	}
}
