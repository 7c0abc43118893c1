package lease

import (
	"strings"

	"github.com/gpulet/gpulet/agent/inventory"
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
func (m *Manager) requestUnits(req Request) int {
	if req.GPUs > 0 {
		return req.GPUs * m.cfg.Model.UnitsPerGPU
	}
	return req.Units
}

// allUnits is every unit index of one GPU.
func (m *Manager) allUnits() []int {
	out := make([]int, m.cfg.Model.UnitsPerGPU)
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

// createWholeFIFOsLocked makes the FIFOs of every unit of the GPUs gpus, or
// none of them (retry: the table changed, place again).
func (m *Manager) createWholeFIFOsLocked(gpus []int) (retry bool, err error) {
	units := m.allUnits()
	for n, g := range gpus {
		retry, err := m.createFIFOsLocked(g, units)
		if err == nil && !retry {
			continue
		}
		for _, h := range gpus[:n] {
			for _, u := range units {
				m.removeFIFOLocked(h, u)
			}
		}
		return retry, err
	}
	return false, nil
}
