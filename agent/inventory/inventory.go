// Package inventory finds the node's GPUs and samples what they report. It owns
// the backends (NVML and simulated) and nothing else: units, leases and MPS
// belong to other packages. Everything the agent asks of a backend is in the
// Inventory interface, so that the simulated backend, first-class on machines
// without a GPU, is never a special case outside this package.
package inventory

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Device is what a GPU is; it does not change while the daemon runs. A figure
// the backend could not read is 0.
type Device struct {
	Index            int
	UUID             string
	Name             string
	MemoryTotalMiB   uint64
	CCMajor, CCMinor int
	Cores            int
	// MaxSMClockMHz is the SM clock's maximum (boost) clock.
	MaxSMClockMHz     int
	MemoryBusWidthBit int
	// MemoryClockMHz is the memory's maximum clock as NVML reports it, which
	// counts one edge of a double data rate (see MemoryBandwidthGBps).
	MemoryClockMHz int
	// NUMANode is the NUMA node the GPU is attached to, the topology hint the
	// kubelet aligns CPUs with; -1 when unknown.
	NUMANode int
}

// CC is the device's compute capability; zero when unknown.
func (d Device) CC() api.ComputeCapability {
	return api.ComputeCapability{Major: d.CCMajor, Minor: d.CCMinor}
}

// ComputeCapability is the device's capability as "major.minor".
func (d Device) ComputeCapability() string { return d.CC().String() }

// MemoryBandwidthGBps is the peak memory bandwidth in GB/s (10^9 bytes a
// second), rounded down: bus width/8 bytes × memory clock × 2 transfers a
// clock. NVML reports HBM's clock (A100-80GB: 1593 MHz on 5120 bits, 2039
// GB/s) and GDDR's (T4: 5001 MHz on 256 bits, 320 GB/s) alike, so that one
// formula gives the published figure of either; docs/placement.md has the
// table. 0 when the bus width or the clock is unknown.
func (d Device) MemoryBandwidthGBps() int {
	return d.MemoryBusWidthBit / 8 * d.MemoryClockMHz * 2 / 1000
}

// Load is what the agent knows of a GPU's use; the simulated backend derives its
// figures from it, the NVML backend ignores it.
type Load struct {
	UnitsUsed  int
	UnitsTotal int
	// MPS says whether clients run under MPS servers.
	MPS bool
	// Clients are the processes known to hold units of the GPU (leases bound
	// to a process, offline claims whose process is known).
	Clients []Client
}

// Client is a process that holds units of a GPU.
type Client struct {
	PID      int
	UID      uint32
	Instance int
	Units    int
	// ShareMiB is its share of the GPU's memory.
	ShareMiB uint64
	// Whole marks the process of a whole-GPU lease, which runs without MPS:
	// it is no client of any instance's MPS server.
	Whole bool
}

// Process is a compute process on a GPU, as NVML lists it.
type Process struct {
	PID           int
	MemoryUsedMiB uint64
}

// Sample is what a GPU reports at one moment. A non-nil Err marks the GPU failed.
type Sample struct {
	// UtilizationPct is the share of the SMs in use, measured as
	// UtilizationSource says (api.UtilSource*).
	UtilizationPct    int
	UtilizationSource string
	// KernelTimePct is the share of time in which any kernel ran (NVML's
	// utilization.gpu).
	KernelTimePct int
	MemoryUsedMiB uint64
	// Processes are the GPU's compute processes (MPS servers and clients
	// included); nil when they could not be read.
	Processes []Process
	// SMByPID is the SM utilization of processes (under MPS: of servers),
	// as last sampled; nil when unknown.
	SMByPID map[int]int
	Err     error
	// Xid is the critical Xid that failed the GPU, if one did; Err is then an
	// *XidError.
	Xid uint64
}

// Inventory is a backend: everything the agent asks of the node's GPUs, so
// that it never needs to know which backend it has.
type Inventory interface {
	// Backend is the name the snapshot reports ("nvml" or "simulated").
	Backend() string
	// Devices lists the GPUs in index order.
	Devices() []Device
	// Sample reads the GPU with the given index.
	Sample(index int, load Load) Sample
	// ClearXid clears the critical Xid that failed the GPU with the given index
	// and returns it (0: it had none).
	ClearXid(index int) uint64
	// OnFault sets what to call when a GPU fails between samples (a
	// critical Xid event), so that it leaves placement at once. A backend
	// that learns of a fault only when it samples never calls it.
	OnFault(f func())
	// ComputeMode reads a GPU's compute mode, for refusing several MPS
	// servers on a GPU that admits one process only.
	ComputeMode(index int) (nvml.ComputeMode, error)
	// Simulator is the simulated backend's controls; nil on real GPUs.
	Simulator() Simulator
	Close() error
}

// Simulator is what only the simulated backend has: GPUs whose reports can be
// set, and MPS servers that stand in for those no control daemon starts
// without a GPU (an mpsctl.ServerSource).
type Simulator interface {
	// Set changes what a simulated GPU reports.
	Set(index int, u api.SimGPUUpdate) error
	ServerList(gpuUUID string, instance int) []int
	// ClientList is false for a server that is gone.
	ClientList(server int) ([]int, bool)
	ServerUID(server int) (uint32, bool)
}

// Resolve finds a GPU among devs by index or UUID, as the API's "gpu" fields
// name it.
func Resolve(devs []Device, s string) (int, error) {
	i, err := api.FindGPU(s, len(devs), func(i int) (int, string) { return devs[i].Index, devs[i].UUID })
	if err != nil {
		return 0, errdefs.Errorf(errdefs.ErrInvalid, "gpu: %v", err)
	}
	return i, nil
}
