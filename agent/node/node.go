// Package node is gpuletd's model of its node: the one rule that says
// whether a GPU takes new leases, the conditions placement reads beyond
// units, and the snapshot built from the lease engine's view, the samples
// and the MPS daemons' state. It holds no lock and starts nothing: the
// agent gathers each moment's inputs and passes them in, so that what the
// node shows depends on those inputs alone.
package node

import (
	"fmt"
	"maps"
	"slices"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/mpsctl"
)

// Node is what does not change while gpuletd runs.
type Node struct {
	Name, BootID string
	// Backend is the inventory's backend, as the snapshot names it.
	Backend string
	// MPS is whether MPS runs.
	MPS            bool
	Model          units.Model
	MaxUtilization int
	Devices        []inventory.Device
}

// MPSDaemons is what the node reads of the MPS control daemons: the state
// of each instance of a GPU (mpsctl.Daemons).
type MPSDaemons interface {
	Status(gpuUUID string) []mpsctl.InstanceStatus
}

// GPUState is a GPU's state from its sample, and why it takes no new leases
// (empty when it may). This is the one eligibility rule: placement (through
// Conditions) and the snapshot both read it.
func (n *Node) GPUState(s inventory.Sample) (state, unusable string) {
	switch {
	case s.Err != nil:
		return api.GPUFailed, "failed: " + s.Err.Error()
	case s.UtilizationPct > n.MaxUtilization && api.UtilizationRefuses(s.UtilizationSource):
		return api.GPUWorking, fmt.Sprintf("has %d%% of its SMs busy (%s), above --max-utilization %d%%", s.UtilizationPct, s.UtilizationSource, n.MaxUtilization)
	}
	return api.GPUWorking, ""
}

// Conditions are what placement must know beyond units: draining, each
// GPU's eligibility and free memory, the memory its processes beside gpulet
// use (from the accounting's table used, empty before its first round;
// nil: accounting is off), each
// instance's health and server. samples holds one sample per device.
func (n *Node) Conditions(draining bool, samples []inventory.Sample, mps MPSDaemons, used *usage.Table) *lease.Conditions {
	c := &lease.Conditions{Draining: draining, GPUs: make([]lease.GPUCondition, len(n.Devices))}
	for i, d := range n.Devices {
		_, unusable := n.GPUState(samples[i])
		free := uint64(0)
		if samples[i].MemoryUsedMiB < d.MemoryTotalMiB {
			free = d.MemoryTotalMiB - samples[i].MemoryUsedMiB
		}
		gc := lease.GPUCondition{Unusable: unusable, MemoryFreeMiB: free}
		// A GPU whose processes could not be read was not accounted: what
		// runs beside gpulet there is unknown.
		if used != nil && samples[i].Processes != nil {
			gc.Accounted = true
			if i < len(used.GPUs) {
				gc.OutsideMiB = used.GPUs[i].OutsideMiB
			}
		}
		for _, st := range mps.Status(d.UUID) {
			down := ""
			if !api.InstanceTakesLeases(st.State) {
				down = "is " + st.State
				if st.Err != nil {
					down += ": " + st.Err.Error()
				}
			}
			gc.InstanceDown = append(gc.InstanceDown, down)
			gc.ServerUID = append(gc.ServerUID, st.ServerUID)
		}
		c.GPUs[i] = gc
	}
	return c
}

// SameSamples reports whether two rounds of samples read the same: only a
// round that differs makes a new snapshot, so that an idle node's seq stays
// where it is.
func SameSamples(x, y []inventory.Sample) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !sameSample(&x[i], &y[i]) {
			return false
		}
	}
	return true
}

// sameSample reports whether two samples of a GPU read the same.
func sameSample(a, b *inventory.Sample) bool {
	return a.UtilizationPct == b.UtilizationPct && a.UtilizationSource == b.UtilizationSource && a.KernelTimePct == b.KernelTimePct &&
		a.MemoryUsedMiB == b.MemoryUsedMiB && a.Xid == b.Xid && (a.Err == nil) == (b.Err == nil) &&
		(a.Err == nil || a.Err.Error() == b.Err.Error()) &&
		slices.Equal(a.Processes, b.Processes) && maps.Equal(a.SMByPID, b.SMByPID)
}
