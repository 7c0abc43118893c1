package agent

import (
	"context"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// The Agent is the API's Core (server.Core): what it adds to the lease engine
// and the node. The rest of the API calls the snapshot store and the lease
// engine themselves (server.Parts).

// Acquire grants a lease. Only a lease granted is learnt in the frag
// policy's mix: a request refused, or one that could never fit, would let
// anyone steer where others' leases go at no cost.
func (a *Agent) Acquire(ctx context.Context, peer identity.Peer, req lease.Request) (lease.Grant, error) {
	g, err := a.leases.Acquire(ctx, peer, req)
	if err == nil {
		a.observe(peer.UID, req)
	}
	return g, err
}

// List lists peer's leases (all, for admins).
func (a *Agent) List(peer identity.Peer) []api.Lease { return a.withUsage(a.leases.List(peer)) }

// Get returns one lease.
func (a *Agent) Get(peer identity.Peer, id string) (api.Lease, error) {
	l, err := a.leases.Get(peer, id)
	if err != nil {
		return l, err
	}
	return a.withUsage([]api.Lease{l})[0], nil
}

// SetDraining stops or resumes new leases.
func (a *Agent) SetDraining(on bool) {
	if a.draining.Swap(on) != on {
		a.log.Info("node draining changed", "draining", on)
	}
	if a.updateConditions() {
		a.changed()
	}
}

// ClearXid clears the critical Xid that failed a GPU (index or UUID), so
// that it takes leases again.
func (a *Agent) ClearXid(gpu string) (int, uint64, error) {
	i, err := inventory.Resolve(a.devs, gpu)
	if err != nil {
		return 0, 0, err
	}
	xid := a.inv.ClearXid(i)
	a.sample()
	return i, xid, nil
}

// simGPU is the simulated backend's control, nil on a real backend: each
// change is sampled at once.
func (a *Agent) simGPU() func(int, api.SimGPUUpdate) error {
	sim := a.inv.Simulator()
	if sim == nil {
		return nil
	}
	return func(i int, u api.SimGPUUpdate) error {
		if err := sim.Set(i, u); err != nil {
			return err
		}
		a.sample()
		return nil
	}
}
