package lease

import (
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Explain says where a lease for req would go now and why each GPU was kept
// or left out, or gives the error the lease would get; it changes nothing
// (POST /v1/placements, gpurun --dry-run). A lease that would draw on or
// borrow from a reservation says which, with no verdicts: its units come from
// the reservation, not from a choice among GPUs.
func (m *Manager) Explain(peer identity.Peer, req Request) (api.Placement, error) {
	if req.Units > m.cfg.Model.UnitsPerClient {
		return api.Placement{}, errdefs.Errorf(errdefs.ErrInvalid, "units: %d is more than one process may hold (--units-per-client %d)", req.Units, m.cfg.Model.UnitsPerClient)
	}
	if req.PID != 0 && !peer.Admin && peer.UID != 0 {
		// The lease takes only the caller's own process (bindingFor), and
		// so does its dry run: what a process holds is told only to its
		// owner, as the lease's refusal tells nothing of others' processes.
		p, _, err := m.cfg.Processes.OpenOwned(req.PID, peer.UID)
		if err != nil {
			return api.Placement{}, pidError(req.PID, true, false, err)
		}
		p.Close()
	}
	if !m.lockOpen() {
		return api.Placement{}, errStopping
	}
	defer m.unlock()
	if m.journal.Failed() != nil {
		return api.Placement{}, unrecorded("no lease is granted", m.journal.Failed())
	}
	if req.TTL == 0 && req.GPUs == 0 && req.Slurm == "" {
		// Bound to a process (a Slurm lease is the job's, bound to none,
		// as a ttl lease is): the one named, or the caller's own. The dry
		// run holds no process, so it counts what the pid holds, whichever
		// process of that pid held it.
		pid := req.PID
		if pid == 0 {
			pid = peer.PID
		}
		if err := m.processCap(pid, m.heldByPIDLocked(pid), req.Units); err != nil {
			return api.Placement{}, err
		}
	}
	if err := m.checkQuotaLocked(peer, requestUnits(m.cfg.Model, req), req.Reservation); err != nil {
		return api.Placement{}, err
	}
	// The decision the lease would get, borrowing or drawing on a
	// reservation included; then, for an ordinary placement, why each GPU
	// was kept or left out.
	d, dr, err := m.placeLocked(peer, req)
	if err != nil {
		return api.Placement{}, err
	}
	if dr == nil {
		if ex, err := m.engine.Load().Explain(m.pub.nodeLocked(), m.placementRequest(peer, req)); err == nil {
			d.Verdicts = ex.Verdicts
		}
	}
	p := api.Placement{
		GPU:         api.LeaseGPU{Index: d.Choice.GPU, UUID: m.gpus[d.Choice.GPU].dev.UUID},
		Instance:    d.Choice.Instance,
		Units:       d.Choice.Units,
		Policy:      string(d.Policy),
		Reservation: dr.name(),
		Preemptible: dr.borrowed(),
		Candidates:  make([]api.Candidate, len(d.Verdicts)),
	}
	if len(d.Choice.GPUs) > 0 {
		p.Units = allUnits(m.cfg.Model)
		for _, g := range d.Choice.GPUs {
			p.GPUs = append(p.GPUs, api.LeaseGPU{Index: g, UUID: m.gpus[g].dev.UUID})
		}
	}
	for i, v := range d.Verdicts {
		p.Candidates[i] = api.Candidate{GPU: v.GPU, Kept: v.Kept, Why: v.Why}
		if s := v.Score; s != nil {
			p.Candidates[i].Score = &api.Score{CC: s.CC, Bandwidth: s.Bandwidth, Clock: s.Clock, Card: s.Card, Similarity: s.Similarity, Total: s.Total}
		}
	}
	return p, nil
}

// heldByPIDLocked is the units held by leases bound to pid.
func (m *Manager) heldByPIDLocked(pid int) int {
	n := 0
	for k, held := range m.held {
		if k.pid == pid {
			n += held
		}
	}
	return n
}
