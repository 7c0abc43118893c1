// Package units is the unit model of docs/design.md §1.1: how many units a
// GPU has, how they are split among its MPS instances, and what share of the GPU
// a number of units is.
package units

import (
	"fmt"

	"github.com/gpulet/gpulet/pipefile"
)

// Model holds M (units per client), N (clients per instance), K (instances per
// GPU) and U (units per GPU).
type Model struct {
	UnitsPerClient     int // M
	ClientsPerInstance int // N
	InstancesPerGPU    int // K
	UnitsPerGPU        int // U
}

// DefaultUnitsPerGPU is U when --units-per-gpu is not given: a sixteenth of a
// GPU is a unit (an H100's 5 GiB and 8 of its 132 SMs).
const DefaultUnitsPerGPU = 16

// Default is the model of the defaults: U=16 units a GPU, one process may
// hold up to a whole GPU (M=U), N=16 clients an instance, K=1 instance.
func Default() Model { return Model{16, 16, 1, 16} }

// New builds a Model. u = 0 means M×N×K when m is given, else
// DefaultUnitsPerGPU (at least K); m = 0 means U, a whole GPU. It refuses values below 1 and a U above
// M×N×K, naming both numbers.
func New(m, n, k, u int) (Model, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"--clients-per-instance", n}, {"--instances-per-gpu", k}} {
		if f.v < 1 {
			return Model{}, fmt.Errorf("%s must be at least 1, got %d", f.name, f.v)
		}
	}
	if m < 0 || m == 0 && u < 0 {
		return Model{}, fmt.Errorf("--units-per-client must be at least 1, got %d", m)
	}
	if m > 1<<16 || n > 1<<16 || k > 1<<10 || u > 1<<20 {
		return Model{}, fmt.Errorf("unit model too large: M=%d N=%d K=%d U=%d", m, n, k, u)
	}
	if u == 0 {
		// An admin who sets M chose the model: U is M×N×K, as it always was.
		u = max(DefaultUnitsPerGPU, k)
		if m > 0 {
			u = m * n * k
		}
	}
	if m == 0 {
		m = max(u, 1)
	}
	max := m * n * k
	if u < 1 {
		return Model{}, fmt.Errorf("--units-per-gpu must be at least 1, got %d", u)
	}
	if u > max {
		return Model{}, fmt.Errorf("--units-per-gpu %d is more than M×N×K = %d×%d×%d = %d units a GPU can serve", u, m, n, k, max)
	}
	if u < k {
		return Model{}, fmt.Errorf("--units-per-gpu %d is fewer than --instances-per-gpu %d: every instance needs a unit", u, k)
	}
	return Model{m, n, k, u}, nil
}

// InstanceRange returns the units instance k owns as [start, start+n):
// contiguous ranges, as even as possible, the first U mod K instances one unit
// larger.
func (m Model) InstanceRange(k int) (start, n int) {
	base, extra := m.UnitsPerGPU/m.InstancesPerGPU, m.UnitsPerGPU%m.InstancesPerGPU
	n = base
	if k < extra {
		n++
	}
	return k*base + min(k, extra), n
}

// InstanceUnits lists the unit indices instance k owns.
func (m Model) InstanceUnits(k int) []int {
	start, n := m.InstanceRange(k)
	out := make([]int, n)
	for i := range out {
		out[i] = start + i
	}
	return out
}

// InstanceOf returns the instance that owns unit i, -1 for no unit of a GPU.
// It is arithmetic, as every ledger event and probe asks it.
func (m Model) InstanceOf(i int) int {
	if i < 0 || i >= m.UnitsPerGPU {
		return -1
	}
	base, extra := m.UnitsPerGPU/m.InstancesPerGPU, m.UnitsPerGPU%m.InstancesPerGPU
	if big := extra * (base + 1); i < big {
		return i / (base + 1)
	}
	return extra + (i-extra*(base+1))/base
}

// ThreadPercentage is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for n units:
// ceil(100·n/U), the same arithmetic offline claimers use.
func (m Model) ThreadPercentage(n int) int {
	return pipefile.ThreadPercentage(n, m.UnitsPerGPU)
}

// MemoryShareMiB is n units' share of a GPU with total MiB of memory.
func (m Model) MemoryShareMiB(n int, total uint64) uint64 {
	return pipefile.MemoryShareMiB(n, m.UnitsPerGPU, total)
}
