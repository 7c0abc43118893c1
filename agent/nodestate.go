package agent

import (
	"reflect"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/node"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/snapshot"
)

// The node model (package node) decides what the node shows; these are the
// agent's side of it: gathering its inputs, and publishing what it decides.

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
	same := node.SameSamples(a.samples, out)
	a.samples = out
	a.sampleMu.Unlock()
	if a.updateConditions() || !same {
		a.changed()
	}
}

func (a *Agent) lastSamples() []inventory.Sample {
	a.sampleMu.Lock()
	defer a.sampleMu.Unlock()
	return a.samples
}

// updateConditions publishes the node model's conditions; then the lease
// engine serves the waiters they may let in. The main loop, the MPS checks
// and the API all call it: one at a time, so that conditions read earlier
// never replace conditions read later. It reports whether they changed;
// unchanged ones are not stored again.
func (a *Agent) updateConditions() bool {
	a.condMu.Lock()
	defer a.condMu.Unlock()
	var used *usage.Table
	if a.usage != nil {
		// Before accounting's first round (the first sample is taken before
		// the lease engine opens) nothing is found beside gpulet: the
		// conditions must not change only because a round came.
		if used = a.usage.Table(); used == nil {
			used = &usage.Table{}
		}
	}
	c := a.node.Conditions(a.draining.Load(), a.lastSamples(), a.mps, used)
	if old := a.conditions.Load(); old != nil && reflect.DeepEqual(old, c) {
		return false
	}
	a.conditions.Store(c)
	if a.leases != nil {
		a.leases.SetConditions(c)
	}
	return true
}

// buildSnapshot makes a snapshot from the lease engine's published view and
// the last samples; the store calls it, one at a time, on the first read after
// a change. It takes no lock of the lease table.
func (a *Agent) buildSnapshot() *snapshot.Published {
	return a.builder.Build(node.Inputs{
		Now: time.Now(), View: a.leases.View(), Samples: a.lastSamples(), MPS: a.mps,
		Draining: a.draining.Load(), ViewStatus: a.view.Load(), Upstreams: a.upstreams.Status(), Usage: a.usageTable(),
		ConfigError: a.reloadFailed.Load(),
	})
}
