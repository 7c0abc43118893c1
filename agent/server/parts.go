package server

import (
	"context"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/snapshot"
)

// Parts are what the API calls into, each the smallest thing that answers its
// routes: the snapshot store and the lease engine and its features themselves
// where the agent has nothing to add, the agent (Core) where it has.
type Parts struct {
	Snapshots    Snapshots
	Leases       Leases
	SlurmJobs    SlurmJobs
	Reservations Reservations
	Core         Core
	// SimGPU changes what a simulated GPU reports; only the simulated
	// backend has it, so nil means the route does not exist.
	SimGPU func(index int, u api.SimGPUUpdate) error
}

// Snapshots is the published snapshot and its change signal: in gpuletd,
// the *snapshot.Store.
type Snapshots interface {
	Load() *snapshot.Published
	// Changed is closed at the next change of what Load returns.
	Changed() <-chan struct{}
}

// Leases are the lease engine's calls the API makes as they are: in gpuletd,
// the *lease.Manager.
type Leases interface {
	Renew(peer identity.Peer, id string) (api.Lease, error)
	Release(peer identity.Peer, id string) error
}

// SlurmJobs is the lease engine's Slurm feature: in gpuletd, *lease.SlurmJobs.
type SlurmJobs interface {
	// ReleaseJob ends every lease of a Slurm job (root and admins).
	ReleaseJob(peer identity.Peer, job uint64) ([]string, error)
}

// Reservations are the workflow reservations (docs/design.md §12): in
// gpuletd, the lease engine's feature *lease.Reservations.
type Reservations interface {
	Reserve(peer identity.Peer, spec reserve.Spec) (api.Reservation, error)
	List() []api.Reservation
	Get(name string) (api.Reservation, error)
	Advance(peer identity.Peer, name string) (api.Reservation, error)
	Unreserve(peer identity.Peer, name string) error
}

// Core is what the agent adds to the lease engine and the node: lease
// requests it learns the request mix from, leases it adds what they use to,
// the node's conditions, and the config's answers.
type Core interface {
	Acquire(ctx context.Context, peer identity.Peer, req lease.Request) (lease.Grant, error)
	List(peer identity.Peer) []api.Lease
	Get(peer identity.Peer, id string) (api.Lease, error)
	SetDraining(draining bool)
	// ClearXid clears the critical Xid that failed a GPU (index or UUID) and
	// returns the GPU's index and the Xid cleared (0: it had none).
	ClearXid(gpu string) (index int, xid uint64, err error)
	// Explain says where a lease for req would go now, changing nothing.
	Explain(peer identity.Peer, req lease.Request) (api.Placement, error)
	// Profiles is the task–engine affinity table as peer may see it.
	Profiles(peer identity.Peer) api.ProfileList
	// Pools lists the configured pools, as peer may use them.
	Pools(peer identity.Peer) api.PoolList
	// Quotas lists the quotas that apply to peer, with what it holds.
	Quotas(peer identity.Peer) api.QuotaList
}
