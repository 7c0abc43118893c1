package lease

import (
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// A feature is a kind of lease or holding beyond the table's own process and
// ttl leases: workflow reservations (Reservations), Slurm jobs (slurmJobs),
// Kubernetes pods (Pods). Each owns its state, under the table's lock, and
// changes the table through the table's Locked methods; the table calls a
// feature only through these hooks, each with its lock held, so that the
// ordinary grant path (request → table → placement) goes through no feature
// that is not involved.
type feature interface {
	// answerLocked may answer a request with a lease the feature has
	// already (ok): a Slurm job's next step gets the job's lease.
	answerLocked(peer identity.Peer, req Request, bind binding) (g Grant, ok bool, err error)
	// placeLocked places a request that names what the feature holds (ok):
	// a draw on, or a borrow from, a named reservation.
	placeLocked(eng *placement.Engine, peer identity.Peer, req Request, pr placement.Request) (d placement.Decision, dr *draw, ok bool, err error)
	// shortLocked may place, on units of its own, a request that ordinary
	// free units cannot hold (short says why; ok false: it cannot either).
	shortLocked(eng *placement.Engine, peer identity.Peer, req Request, pr placement.Request, short error) (d placement.Decision, dr *draw, ok bool, err error)
	// admitLocked runs when units may have come free, before waiting
	// requests are served: a feature that queues for units is served first.
	admitLocked()
	// restoreLocked takes the feature's state back at start, once the
	// journal's leases are in the table.
	restoreLocked()
	// tickLocked runs every sample interval (Manager.Tick).
	tickLocked()
}

// noHooks is a feature that uses no hook; features embed it and override
// the hooks they use.
type noHooks struct{}

func (noHooks) answerLocked(identity.Peer, Request, binding) (Grant, bool, error) {
	return Grant{}, false, nil
}

func (noHooks) placeLocked(*placement.Engine, identity.Peer, Request, placement.Request) (placement.Decision, *draw, bool, error) {
	return placement.Decision{}, nil, false, nil
}

func (noHooks) shortLocked(*placement.Engine, identity.Peer, Request, placement.Request, error) (placement.Decision, *draw, bool, error) {
	return placement.Decision{}, nil, false, nil
}

func (noHooks) admitLocked()   {}
func (noHooks) restoreLocked() {}
func (noHooks) tickLocked()    {}
