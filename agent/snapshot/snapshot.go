// Package snapshot publishes the node's state as immutable values. The agent is
// the only writer; the API, the FUSE view and the reporter read the current value
// through Store.Load without taking any lock of the agent.
package snapshot

import (
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/gpulet/gpulet/api"
)

// Published is one snapshot with everything readers derive from it. Nothing in
// it may be modified once it is stored.
type Published struct {
	Snapshot *api.Snapshot
	// Leases are all live leases at the moment of the snapshot, sorted by ID.
	Leases []api.Lease

	// The encodings are made on first use, once: under lease churn most
	// snapshots are replaced before anyone reads them.
	jsonOnce    sync.Once
	json        []byte
	metricsOnce sync.Once
	metrics     []byte
	render      func(*api.Snapshot) []byte
}

// New builds a Published from a snapshot and the live leases. render produces
// the Prometheus text for Metrics; it runs at most once, on first use.
func New(s *api.Snapshot, leases []api.Lease, render func(*api.Snapshot) []byte) *Published {
	if leases == nil {
		leases = []api.Lease{}
	}
	return &Published{Snapshot: s, Leases: leases, render: render}
}

// JSON is the snapshot encoded once, so that every reader of this snapshot
// serves the same bytes.
func (p *Published) JSON() []byte {
	p.jsonOnce.Do(func() {
		b, err := json.Marshal(p.Snapshot)
		if err != nil {
			// A snapshot holds only strings, numbers and slices of them.
			panic("gpulet: cannot encode snapshot: " + err.Error())
		}
		p.json = append(b, '\n')
	})
	return p.json
}

// Metrics is the Prometheus text exposition of the snapshot, built on first use.
func (p *Published) Metrics() []byte {
	p.metricsOnce.Do(func() {
		if p.render != nil {
			p.metrics = p.render(p.Snapshot)
		}
	})
	return p.metrics
}

// Lease returns the live lease with the given id.
func (p *Published) Lease(id string) (api.Lease, bool) {
	for _, l := range p.Leases {
		if l.ID == id {
			return l, true
		}
	}
	return api.Lease{}, false
}

// Store holds the current Published value.
type Store struct {
	cur atomic.Pointer[Published]
}

// Load returns the current value; nil before the first Store.
func (s *Store) Load() *Published { return s.cur.Load() }

// Store makes p the current value.
func (s *Store) Store(p *Published) { s.cur.Store(p) }
