package agent

import (
	"strconv"
	"time"

	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/snapshot"
)

// buildSnapshot makes a snapshot from the lease engine's published view and
// the last samples; the store calls it, one at a time, on the first read after
// a change. It takes no lock of the lease table.
func (a *Agent) buildSnapshot() *snapshot.Published {
	view := a.leases.View()
	samples := a.lastSamples()
	a.seq++
	s := &api.Snapshot{
		Schema: api.SnapshotSchema, Node: a.cfg.NodeName, BootID: a.bootID, Seq: a.seq,
		Time: time.Now().UTC(), State: api.NodeWorking, Backend: a.inv.Backend(), MPS: mpsMode(a.mpsOn),
		GPUs: make([]api.GPU, len(a.devs)),
	}
	if a.draining.Load() {
		s.State = api.NodeDraining
	}
	if view.Unrecorded != "" {
		s.State, s.Reason = api.NodeDegraded, view.Unrecorded
		if a.draining.Load() {
			s.Reason = "draining; " + s.Reason
		}
	}
	s.View = a.view.Load()
	// As of this snapshot: a push changes nothing that makes a new one.
	s.Upstreams = a.upstreamStatus()
	U := a.cfg.Model.UnitsPerGPU
	used := a.usageTable()
	for i, d := range a.devs {
		gv := view.GPUs[i]
		state, unusable := a.gpuState(samples[i])
		g := api.GPU{
			Index: d.Index, UUID: d.UUID, Name: d.Name, State: state, Eligible: unusable == "",
			UnitsTotal: U, UnitsUsed: gv.Used, UnitsFree: U - gv.Used - gv.Reserved, UnitsOffline: gv.Offline,
			UnitsReserved:  gv.Reserved,
			UtilizationPct: samples[i].UtilizationPct, UtilizationSource: samples[i].UtilizationSource,
			KernelTimePct: samples[i].KernelTimePct, MaxUtilizationPct: a.cfg.MaxUtilization,
			MemoryTotalMiB: d.MemoryTotalMiB, MemoryUsedMiB: samples[i].MemoryUsedMiB,
			Capability: api.Capability{
				ComputeCapability: d.ComputeCapability(), Cores: d.Cores, MaxSMClockMHz: d.MaxSMClockMHz,
				MemoryBusWidthBit: d.MemoryBusWidthBit, MemoryClockMHz: d.MemoryClockMHz,
				MemoryBandwidthGBps: d.MemoryBandwidthGBps(),
			},
		}
		if samples[i].Err != nil {
			g.Error = samples[i].Err.Error()
		}
		g.Xid = samples[i].Xid
		if used != nil && i < len(used.GPUs) {
			u := used.GPUs[i]
			g.OutsideMemoryMiB, g.OutsideProcesses, g.OutsideOverShare = u.OutsideMiB, u.Outside, u.OutsideOverShare
			g.LeasesOverShare, g.Claims = u.OverShare, u.Claims
		}
		if len(gv.OfflineByUID) > 0 {
			g.OfflineByUID = make(map[string]int, len(gv.OfflineByUID))
			for uid, n := range gv.OfflineByUID {
				g.OfflineByUID[strconv.FormatUint(uint64(uid), 10)] = n
			}
		}
		mpsStates := a.mps.Status(d.UUID)
		anyUp := false
		for k, iv := range gv.Instances {
			in := api.Instance{
				Instance: k, State: api.InstanceOff, Clients: iv.Clients,
				ClientsMax: a.cfg.Model.ClientsPerInstance, Units: a.instanceUnits[k], UnitsFree: len(iv.FreeUnits), UID: iv.UID,
				SlurmJobs: iv.SlurmJobs,
			}
			if k < len(mpsStates) {
				st := mpsStates[k]
				in.State = st.State
				if st.ServerUID != nil {
					in.UID = st.ServerUID
				}
				in.SMPct = instanceSM(st.Servers, samples[i].SMByPID)
				for _, srv := range st.Servers {
					in.Servers = append(in.Servers, api.MPSServer{PID: srv.PID, UID: srv.UID, Clients: len(srv.Clients)})
				}
				if st.Err != nil {
					in.Error = st.Err.Error()
				}
			}
			anyUp = anyUp || api.InstanceTakesLeases(in.State)
			if g.State == api.GPUWorking && !api.InstanceTakesLeases(in.State) {
				g.State = api.GPUDegraded
			}
			g.Instances = append(g.Instances, in)
		}
		// A degraded GPU still takes leases on its running instances.
		g.Eligible = g.Eligible && anyUp
		s.GPUs[i] = g
		s.UnitsTotal += g.UnitsTotal
		s.UnitsFree += g.UnitsFree
		s.UnitsReserved += g.UnitsReserved
	}
	for _, r := range view.Reservations {
		s.Reservations = append(s.Reservations, r.ReservationStatus)
	}
	s.OverQuota = view.OverQuota
	counts := metrics.Leases{Live: uint64(view.LeaseCount()), Granted: view.Granted, Ended: view.Ended}
	if used != nil {
		for _, r := range used.Running {
			counts.Measured = append(counts.Measured, metrics.Measured{ID: r.ID, GPU: r.GPU, UID: r.UID, MemoryMiB: r.Usage.MemoryUsedMiB, OverShare: r.Usage.OverShare})
		}
	}
	return snapshot.New(s, view.Leases, func(r *api.Snapshot) []byte {
		c := counts
		if r != s {
			// A redacted copy (--listen, a plain upstream) shows no lease.
			c.Measured = nil
		}
		return metrics.Render(r, c)
	})
}

// instanceSM is an instance's SM utilization: its MPS servers' figures, as
// NVML gives them per process; nil when none is known.
func instanceSM(servers []mpsctl.Server, smByPID map[int]int) *int {
	var sum *int
	for _, s := range servers {
		if v, ok := smByPID[s.PID]; ok {
			if sum == nil {
				sum = new(int)
			}
			*sum += v
		}
	}
	return sum
}
