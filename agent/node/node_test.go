package node

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/mpsctl"
)

// mpsByGPU stands in for the MPS daemons: each GPU's instances by UUID.
type mpsByGPU map[string][]mpsctl.InstanceStatus

func (m mpsByGPU) Status(uuid string) []mpsctl.InstanceStatus { return m[uuid] }

func ptr[T any](v T) *T { return &v }

// testNode is two 80 GiB GPUs of two instances each, 8 units an instance.
func testNode() *Node {
	m := units.Model{UnitsPerClient: 16, ClientsPerInstance: 4, InstancesPerGPU: 2, UnitsPerGPU: 16}
	return &Node{
		Name: "n1", BootID: "boot", Backend: api.BackendSimulated, MPS: true, Model: m, MaxUtilization: 90,
		Devices: []inventory.Device{
			{Index: 0, UUID: "GPU-0", Name: "NVIDIA H100", MemoryTotalMiB: 81920, CCMajor: 9},
			{Index: 1, UUID: "GPU-1", Name: "NVIDIA H100", MemoryTotalMiB: 81920, CCMajor: 9},
		},
	}
}

func TestGPUState(t *testing.T) {
	n := testNode()
	for _, c := range []struct {
		name     string
		s        inventory.Sample
		state    string
		unusable string // a part of the reason; "" when eligible
	}{
		{"idle", inventory.Sample{UtilizationSource: api.UtilSourceGPM}, api.GPUWorking, ""},
		{"at the limit", inventory.Sample{UtilizationPct: 90, UtilizationSource: api.UtilSourceGPM}, api.GPUWorking, ""},
		{"above the limit", inventory.Sample{UtilizationPct: 91, UtilizationSource: api.UtilSourceProcessSM}, api.GPUWorking,
			"has 91% of its SMs busy (process_sm), above --max-utilization 90%"},
		// Kernel time reads 100 for one job on a few SMs: it never refuses.
		{"device figure above the limit", inventory.Sample{UtilizationPct: 100, UtilizationSource: api.UtilSourceDevice}, api.GPUWorking, ""},
		{"failed", inventory.Sample{Err: errors.New("Xid 79"), UtilizationPct: 100, UtilizationSource: api.UtilSourceGPM}, api.GPUFailed, "failed: Xid 79"},
	} {
		state, unusable := n.GPUState(c.s)
		if state != c.state || (c.unusable == "") != (unusable == "") || !strings.Contains(unusable, c.unusable) {
			t.Errorf("%s: GPUState = %q, %q; want %q, %q", c.name, state, unusable, c.state, c.unusable)
		}
	}
}

func TestConditions(t *testing.T) {
	n := testNode()
	samples := []inventory.Sample{
		{MemoryUsedMiB: 1024, UtilizationPct: 95, UtilizationSource: api.UtilSourceGPM},
		// More used than the total (another process's context): none free.
		{MemoryUsedMiB: 90000},
	}
	mps := mpsByGPU{
		"GPU-0": {{Instance: 0, State: api.InstanceRunning, ServerUID: ptr(uint32(1000))}, {Instance: 1, State: api.InstanceDown, Err: errors.New("no answer")}},
		"GPU-1": {{Instance: 0, State: api.InstanceStarting}, {Instance: 1, State: api.InstanceRunning}},
	}
	c := n.Conditions(true, samples, mps, nil)
	if !c.Draining || len(c.GPUs) != 2 {
		t.Fatalf("Conditions = %+v", c)
	}
	g0, g1 := c.GPUs[0], c.GPUs[1]
	if !strings.Contains(g0.Unusable, "above --max-utilization") || g1.Unusable != "" {
		t.Errorf("unusable = %q, %q; want GPU 0 too busy, GPU 1 eligible", g0.Unusable, g1.Unusable)
	}
	if g0.MemoryFreeMiB != 81920-1024 || g1.MemoryFreeMiB != 0 {
		t.Errorf("free memory = %d, %d MiB", g0.MemoryFreeMiB, g1.MemoryFreeMiB)
	}
	if len(g0.InstanceDown) != 2 || g0.InstanceDown[0] != "" || g0.InstanceDown[1] != "is down: no answer" || g1.InstanceDown[0] != "is starting" {
		t.Errorf("instances down = %q, %q", g0.InstanceDown, g1.InstanceDown)
	}
	if g0.ServerUID[0] == nil || *g0.ServerUID[0] != 1000 || g0.ServerUID[1] != nil {
		t.Errorf("server uids = %v", g0.ServerUID)
	}
	// MPS off: no instance is listed, so none is down.
	if c := n.Conditions(false, samples, mpsByGPU{}, nil); c.Draining || c.GPUs[1].InstanceDown != nil {
		t.Errorf("Conditions without MPS = %+v", c)
	}
	// Without accounting nothing says what runs beside gpulet.
	if g0.Accounted || g0.OutsideMiB != 0 {
		t.Errorf("without accounting: accounted %v, outside %d MiB", g0.Accounted, g0.OutsideMiB)
	}
	// With it, the memory it found there; a GPU whose processes could not be
	// read (nil) was not accounted.
	samples[0].Processes = []inventory.Process{}
	c = n.Conditions(false, samples, mpsByGPU{}, &usage.Table{GPUs: []usage.GPU{{OutsideMiB: 700}, {}}})
	if g := c.GPUs[0]; !g.Accounted || g.OutsideMiB != 700 || c.GPUs[1].Accounted {
		t.Errorf("with accounting: %+v", c.GPUs)
	}
}

func TestSameSamples(t *testing.T) {
	base := func() []inventory.Sample {
		return []inventory.Sample{{UtilizationPct: 10, UtilizationSource: api.UtilSourceGPM, KernelTimePct: 20, MemoryUsedMiB: 100,
			Processes: []inventory.Process{{PID: 7}}, SMByPID: map[int]int{7: 10}, Err: errors.New("e")}}
	}
	if !SameSamples(base(), base()) {
		t.Fatal("equal samples read as different")
	}
	for name, change := range map[string]func(s *inventory.Sample){
		"utilization": func(s *inventory.Sample) { s.UtilizationPct++ },
		"source":      func(s *inventory.Sample) { s.UtilizationSource = api.UtilSourceDevice },
		"kernel time": func(s *inventory.Sample) { s.KernelTimePct++ },
		"memory":      func(s *inventory.Sample) { s.MemoryUsedMiB++ },
		"xid":         func(s *inventory.Sample) { s.Xid = 79 },
		"error":       func(s *inventory.Sample) { s.Err = errors.New("other") },
		"no error":    func(s *inventory.Sample) { s.Err = nil },
		"processes":   func(s *inventory.Sample) { s.Processes = append(s.Processes, inventory.Process{PID: 8}) },
		"sm by pid":   func(s *inventory.Sample) { s.SMByPID = map[int]int{7: 11} },
	} {
		y := base()
		change(&y[0])
		if SameSamples(base(), y) {
			t.Errorf("a change of %s reads as the same", name)
		}
	}
	if SameSamples(base(), nil) {
		t.Error("a round of no samples reads as the same as one")
	}
}
