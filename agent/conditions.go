package agent

import (
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// sample reads every GPU and updates what placement sees. Only a sample that
// differs from the last, or conditions that do, make a new snapshot: an idle
// node's seq stays where it is, so that a poller waiting for a change waits
// for one.
func (a *Agent) sample() {
	var view *lease.View
	if a.leases != nil {
		view = a.leases.View()
	}
	claims := a.claimsOf(view)
	out := make([]inventory.Sample, len(a.devs))
	for i := range a.devs {
		out[i] = a.inv.Sample(i, a.loadOf(i, view, claims))
	}
	a.account(view, out, claims)
	a.sampleMu.Lock()
	same := sameSamples(a.samples, out)
	a.samples = out
	a.sampleMu.Unlock()
	if a.updateConditions() || !same {
		a.changed()
	}
}

// sameSamples reports whether two rounds of samples read the same.
func sameSamples(x, y []inventory.Sample) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		a, b := x[i], y[i]
		if a.UtilizationPct != b.UtilizationPct || a.UtilizationSource != b.UtilizationSource || a.KernelTimePct != b.KernelTimePct ||
			a.MemoryUsedMiB != b.MemoryUsedMiB || a.Xid != b.Xid || (a.Err == nil) != (b.Err == nil) ||
			a.Err != nil && a.Err.Error() != b.Err.Error() ||
			!slices.Equal(a.Processes, b.Processes) || !maps.Equal(a.SMByPID, b.SMByPID) {
			return false
		}
	}
	return true
}

func (a *Agent) lastSamples() []inventory.Sample {
	a.sampleMu.Lock()
	defer a.sampleMu.Unlock()
	return a.samples
}

// gpuState is a GPU's state from its sample, and why it takes no new leases
// (empty when it may). This is the one eligibility rule: placement and the
// snapshot both read it.
func (a *Agent) gpuState(s inventory.Sample) (state, unusable string) {
	switch {
	case s.Err != nil:
		return api.GPUFailed, "failed: " + s.Err.Error()
	case s.UtilizationPct > a.cfg.MaxUtilization && api.UtilizationRefuses(s.UtilizationSource):
		return api.GPUWorking, fmt.Sprintf("has %d%% of its SMs busy (%s), above --max-utilization %d%%", s.UtilizationPct, s.UtilizationSource, a.cfg.MaxUtilization)
	}
	return api.GPUWorking, ""
}

// updateConditions publishes what placement must know beyond units: draining,
// each GPU's eligibility and free memory, each instance's health and server;
// then the lease engine serves the waiters they may let in. The main loop,
// the MPS checks and the API all call it: one at a time, so that conditions
// read earlier never replace conditions read later. It reports whether they
// changed; unchanged ones are not stored again.
func (a *Agent) updateConditions() bool {
	a.condMu.Lock()
	defer a.condMu.Unlock()
	samples := a.lastSamples()
	c := &lease.Conditions{Draining: a.draining.Load(), GPUs: make([]lease.GPUCondition, len(a.devs))}
	for i, d := range a.devs {
		_, unusable := a.gpuState(samples[i])
		free := uint64(0)
		if samples[i].MemoryUsedMiB < d.MemoryTotalMiB {
			free = d.MemoryTotalMiB - samples[i].MemoryUsedMiB
		}
		gc := lease.GPUCondition{Unusable: unusable, MemoryFreeMiB: free}
		for _, st := range a.mps.Status(d.UUID) {
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
	if old := a.conditions.Load(); old != nil && reflect.DeepEqual(old, c) {
		return false
	}
	a.conditions.Store(c)
	if a.leases != nil {
		a.leases.SetConditions(c)
	}
	return true
}
