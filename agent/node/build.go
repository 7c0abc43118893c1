package node

import (
	"strconv"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/version"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/snapshot"
)

// Inputs are what one snapshot is built from, as of one moment.
type Inputs struct {
	Now time.Time
	// View is the lease engine's published view.
	View *lease.View
	// Samples are the last samples, one per device.
	Samples  []inventory.Sample
	MPS      MPSDaemons
	Draining bool
	// ViewStatus is the FUSE view's state; nil before mounting was tried,
	// or with no view.
	ViewStatus *api.ViewStatus
	// Upstreams is how pushing to each upstream goes: as of this snapshot,
	// since a push changes nothing that makes a new one.
	Upstreams []api.UpstreamStatus
	// ConfigError says why the last SIGHUP reload failed; nil when none did.
	ConfigError *string
	// Usage is the accounting's last table; nil with accounting off.
	Usage *usage.Table
}

// Builder builds the node's snapshots and numbers them: each has the seq
// after the last one's. It is not safe for concurrent use; the snapshot
// store calls it one build at a time.
type Builder struct {
	node *Node
	// instanceUnits are the unit indices of each instance k, the same on
	// every GPU: made once, and shared by every snapshot, which never
	// changes them.
	instanceUnits [][]int
	seq           uint64
	// kept is what the last build made of each GPU.
	kept []gpuKept
}

// gpuKept is what a build made of one GPU, and what from. A lease changes
// one GPU, so on a large node under churn most GPUs read as they did in the
// last snapshot: they are neither made nor encoded again.
type gpuKept struct {
	// built is the lease view's Built of the GPU; 0: nothing kept.
	built  uint64
	sample inventory.Sample
	mps    []mpsctl.InstanceStatus
	usage  *usage.Table
	gpu    api.GPU
	part   *snapshot.GPUPart
}

// NewBuilder builds the snapshots of n, from seq 1.
func NewBuilder(n *Node) *Builder {
	b := &Builder{node: n, kept: make([]gpuKept, len(n.Devices))}
	for k := range n.Model.InstancesPerGPU {
		b.instanceUnits = append(b.instanceUnits, n.Model.InstanceUnits(k))
	}
	return b
}

// Build makes the next snapshot from in.
func (b *Builder) Build(in Inputs) *snapshot.Published {
	n, view, samples := b.node, in.View, in.Samples
	b.seq++
	s := &api.Snapshot{
		Schema: api.SnapshotSchema, Node: n.Name, BootID: n.BootID, Seq: b.seq,
		Time: in.Now.UTC(), State: api.NodeWorking, Backend: n.Backend, MPS: mpsMode(n.MPS),
		Version: build.Version, Commit: build.Commit,
		GPUs: make([]api.GPU, len(n.Devices)),
	}
	if in.Draining {
		s.State = api.NodeDraining
	}
	if view.Unrecorded != "" {
		s.State, s.Reason = api.NodeDegraded, view.Unrecorded
		if in.Draining {
			s.Reason = "draining; " + s.Reason
		}
	}
	s.View = in.ViewStatus
	s.Upstreams = in.Upstreams
	if in.ConfigError != nil {
		s.ConfigError = *in.ConfigError
	}
	parts := make([]*snapshot.GPUPart, len(n.Devices))
	for i := range n.Devices {
		gv, mpsStates := &view.GPUs[i], in.MPS.Status(n.Devices[i].UUID)
		k := &b.kept[i]
		if k.built == 0 || k.built != gv.Built || k.usage != in.Usage || !sameSample(&k.sample, &samples[i]) || !mpsctl.SameStatuses(k.mps, mpsStates) {
			*k = gpuKept{built: gv.Built, sample: samples[i], mps: mpsStates, usage: in.Usage,
				gpu: b.buildGPU(i, gv, &samples[i], mpsStates, in.Usage), part: new(snapshot.GPUPart)}
		}
		g := k.gpu
		s.GPUs[i], parts[i] = g, k.part
		s.UnitsTotal += g.UnitsTotal
		s.UnitsFree += g.UnitsFree
		s.UnitsReserved += g.UnitsReserved
	}
	for _, r := range view.Reservations {
		s.Reservations = append(s.Reservations, r.ReservationStatus)
	}
	s.OverQuota = view.OverQuota
	counts := metrics.Leases{Live: uint64(view.LeaseCount()), Granted: view.Granted, Ended: view.Ended}
	if in.Usage != nil {
		for _, r := range in.Usage.Running {
			counts.Measured = append(counts.Measured, metrics.Measured{ID: r.ID, GPU: r.GPU, UID: r.UID, MemoryMiB: r.Usage.MemoryUsedMiB, OverShare: r.Usage.OverShare})
		}
	}
	return snapshot.NewWithGPUParts(s, parts, view.Leases, func(r *api.Snapshot) []byte {
		c := counts
		if r != s {
			// A redacted copy (--listen, a plain upstream) shows no lease.
			c.Measured = nil
		}
		return metrics.Render(r, c)
	})
}

// buildGPU makes GPU i of the snapshot from its part of the lease view, its
// sample, its MPS instances' states and the accounting's table (nil: off).
func (b *Builder) buildGPU(i int, gv *lease.GPUView, sample *inventory.Sample, mpsStates []mpsctl.InstanceStatus, used *usage.Table) api.GPU {
	n, d, U := b.node, b.node.Devices[i], b.node.Model.UnitsPerGPU
	state, unusable := n.GPUState(*sample)
	g := api.GPU{
		Index: d.Index, UUID: d.UUID, Name: d.Name, State: state, Eligible: unusable == "",
		UnitsTotal: U, UnitsUsed: gv.Used, UnitsFree: U - gv.Used - gv.Reserved, UnitsOffline: gv.Offline,
		UnitsReserved:  gv.Reserved,
		UtilizationPct: sample.UtilizationPct, UtilizationSource: sample.UtilizationSource,
		KernelTimePct: sample.KernelTimePct, MaxUtilizationPct: n.MaxUtilization,
		MemoryTotalMiB: d.MemoryTotalMiB, MemoryUsedMiB: sample.MemoryUsedMiB, MemoryHeldMiB: gv.HeldMemoryMiB,
		Capability: api.Capability{
			ComputeCapability: d.ComputeCapability(), Cores: d.Cores, MaxSMClockMHz: d.MaxSMClockMHz,
			MemoryBusWidthBit: d.MemoryBusWidthBit, MemoryClockMHz: d.MemoryClockMHz,
			MemoryBandwidthGBps: d.MemoryBandwidthGBps(),
		},
	}
	if sample.Err != nil {
		g.Error = sample.Err.Error()
	}
	g.Xid = sample.Xid
	if used != nil && i < len(used.GPUs) {
		u := used.GPUs[i]
		g.OutsideMemoryMiB, g.OutsideProcesses, g.OutsideOverShare = u.OutsideMiB, u.Outside, u.OutsideOverShare
		g.LeasesOverShare, g.Claims = u.OverShare, u.Claims
	}
	if len(gv.OfflineByUID) > 0 {
		g.OfflineByUID = make(map[string]int, len(gv.OfflineByUID))
		for uid, count := range gv.OfflineByUID {
			g.OfflineByUID[strconv.FormatUint(uint64(uid), 10)] = count
		}
	}
	anyUp := false
	for k, iv := range gv.Instances {
		inst := api.Instance{
			Instance: k, State: api.InstanceOff, Clients: iv.Clients,
			ClientsMax: n.Model.ClientsPerInstance, Units: b.instanceUnits[k], UnitsFree: len(iv.FreeUnits), UID: iv.UID,
			SlurmJobs: iv.SlurmJobs,
		}
		if k < len(mpsStates) {
			st := mpsStates[k]
			inst.State = st.State
			if st.ServerUID != nil {
				inst.UID = st.ServerUID
			}
			inst.SMPct = instanceSM(st.Servers, sample.SMByPID)
			for _, srv := range st.Servers {
				inst.Servers = append(inst.Servers, api.MPSServer{PID: srv.PID, UID: srv.UID, Clients: len(srv.Clients)})
			}
			if st.Err != nil {
				inst.Error = st.Err.Error()
			}
		}
		anyUp = anyUp || api.InstanceTakesLeases(inst.State)
		if g.State == api.GPUWorking && !api.InstanceTakesLeases(inst.State) {
			g.State = api.GPUDegraded
		}
		g.Instances = append(g.Instances, inst)
	}
	// A degraded GPU still takes leases on its running instances.
	g.Eligible = g.Eligible && anyUp
	return g
}

// mpsMode is the snapshot's "mps": whether MPS runs.
func mpsMode(on bool) string {
	if on {
		return "on"
	}
	return "off"
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

// build is the gpuletd this is, read once: every snapshot says it.
var build = version.Get()
