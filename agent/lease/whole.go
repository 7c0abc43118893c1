package lease

import (
	"strings"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// A whole-GPU lease (Request.GPUs = N) holds every unit of N GPUs; its Units
// are every unit of one GPU, held on each of its GPUs. The job runs without
// MPS, as on a dedicated GPU.

// gpusOf is the GPUs whose Units pub holds, in CUDA_VISIBLE_DEVICES order.
func gpusOf(pub *api.Lease) []int {
	if len(pub.GPUs) == 0 {
		return []int{pub.GPU.Index}
	}
	out := make([]int, len(pub.GPUs))
	for i, g := range pub.GPUs {
		out[i] = g.Index
	}
	return out
}

// unitsHeld is every unit pub holds, on all its GPUs: what quotas count.
func unitsHeld(pub *api.Lease) int {
	return len(pub.Units) * max(1, len(pub.GPUs))
}

// requestUnits is the units req would hold.
func requestUnits(model units.Model, req Request) int {
	if req.GPUs > 0 {
		return req.GPUs * model.UnitsPerGPU
	}
	return req.Units
}

// allUnits is every unit index of one GPU.
func allUnits(model units.Model) []int {
	out := make([]int, model.UnitsPerGPU)
	for u := range out {
		out[u] = u
	}
	return out
}

// WholeEnv is the environment of a lease of the whole GPUs devs: every GPU
// visible, in order, and no MPS variable.
func WholeEnv(devs []inventory.Device) map[string]string {
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = d.UUID
	}
	return map[string]string{pipefile.EnvVisibleDevices: strings.Join(uuids, ",")}
}
