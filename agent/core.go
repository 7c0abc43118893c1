package agent

import (
	"context"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/snapshot"
)

// The Agent is the API's core (server.Core): each method is one call into the
// part that owns it.

// Published is the current snapshot.
func (a *Agent) Published() *snapshot.Published { return a.store.Load() }

// Changed is closed at the next change of the snapshot.
func (a *Agent) Changed() <-chan struct{} { return a.store.Changed() }

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

// Renew extends a time-bound lease.
func (a *Agent) Renew(peer identity.Peer, id string) (api.Lease, error) {
	return a.leases.Renew(peer, id)
}

// Release ends a lease.
func (a *Agent) Release(peer identity.Peer, id string) error { return a.leases.Release(peer, id) }

// ReleaseSlurmJob ends the leases of a Slurm job.
func (a *Agent) ReleaseSlurmJob(peer identity.Peer, job uint64) ([]string, error) {
	return a.leases.ReleaseSlurmJob(peer, job)
}

// Reserve makes a workflow reservation.
func (a *Agent) Reserve(peer identity.Peer, spec reserve.Spec) (api.Reservation, error) {
	return a.leases.Reserve(peer, spec)
}

// Reservations lists the workflow reservations.
func (a *Agent) Reservations() []api.Reservation { return a.leases.Reservations() }

// Reservation returns one workflow reservation.
func (a *Agent) Reservation(name string) (api.Reservation, error) { return a.leases.Reservation(name) }

// Advance starts the next stage of a reservation.
func (a *Agent) Advance(peer identity.Peer, name string) (api.Reservation, error) {
	return a.leases.Advance(peer, name)
}

// Unreserve ends a reservation.
func (a *Agent) Unreserve(peer identity.Peer, name string) error {
	return a.leases.Unreserve(peer, name)
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

// SimGPU is the simulated backend's control, nil on a real backend.
func (a *Agent) SimGPU() func(int, api.SimGPUUpdate) error {
	sim, ok := a.inv.(*inventory.Sim)
	if !ok {
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
