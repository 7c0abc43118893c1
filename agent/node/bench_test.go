package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/mpsctl"
)

// BenchmarkBuildAndEncode builds and encodes a snapshot of the node of
// BenchmarkLeaseUnderReaders/api-held=10000 (16 GPUs of 704 units, one
// instance each) after a change: of one GPU, as a lease makes, or of every
// GPU, as a new round of samples with accounting on does. Each GPU's MPS
// instance runs, and its state is read afresh at each build, as
// mpsctl.Daemons gives it.
func BenchmarkBuildAndEncode(b *testing.B) {
	const gpus, unitsPerGPU = 16, 704
	n := &Node{Name: "n1", BootID: "boot", Backend: api.BackendSimulated, MPS: true, MaxUtilization: 90,
		Model: units.Model{UnitsPerClient: unitsPerGPU, ClientsPerInstance: unitsPerGPU, InstancesPerGPU: 1, UnitsPerGPU: unitsPerGPU}}
	view := &lease.View{}
	samples := make([]inventory.Sample, gpus)
	for i := range gpus {
		n.Devices = append(n.Devices, inventory.Device{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: "NVIDIA A100-SXM4-80GB", MemoryTotalMiB: 81920, CCMajor: 8})
		free := make([]int, 0, unitsPerGPU)
		for u := 625; u < unitsPerGPU; u++ {
			free = append(free, u)
		}
		view.GPUs = append(view.GPUs, lease.GPUView{Built: 1, Used: 625, Instances: []lease.InstanceView{{FreeUnits: free, Size: unitsPerGPU, Clients: 625}}})
		samples[i] = inventory.Sample{UtilizationPct: 20, UtilizationSource: api.UtilSourceSimulated, MemoryUsedMiB: 40000}
	}
	for _, c := range []struct {
		name    string
		changed int // GPUs changed between builds
	}{{"one-gpu-changed", 1}, {"all-changed", gpus}} {
		b.Run(c.name, func(b *testing.B) {
			builder := NewBuilder(n)
			in := Inputs{Now: time.Now(), View: view, Samples: samples, MPS: freshMPS{}}
			for i := 0; b.Loop(); i++ {
				for g := range c.changed {
					view.GPUs[(i+g)%gpus].Built++
				}
				builder.Build(in).WithJSON(func([]byte) {})
			}
		})
	}
}

// freshMPS is every GPU's instance running, in a new list at each call as
// mpsctl.Daemons.Status makes it.
type freshMPS struct{}

func (freshMPS) Status(string) []mpsctl.InstanceStatus {
	return []mpsctl.InstanceStatus{{Instance: 0, State: api.InstanceRunning, PID: 4242}}
}
