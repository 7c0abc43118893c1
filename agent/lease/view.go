package lease

import (
	"slices"
	"sort"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

type slotState uint8

const (
	slotFree slotState = iota
	slotLeased
	slotOffline
	// slotBlocked: something that is no FIFO sits at the unit's name, so its
	// FIFO cannot be made; the ledger's sweep removes it, and its watch event
	// frees the slot. Counted as used meanwhile: the unit cannot be leased.
	slotBlocked
	// slotReserved: set aside for a workflow reservation (res), or held for
	// a pending one, and not in use. Neither free nor used.
	slotReserved
)

type slot struct {
	state slotState
	lease *lease // when leased
	// own counts the daemon's own makes and removals of this unit's FIFO
	// whose watch events have not arrived yet. Events of one name arrive in
	// order, so the next that many are the daemon's own and change nothing;
	// should one stand in for a claimer's event instead, the daemon's own
	// event comes after it and is looked at, so the slot still ends up true.
	// A rescan, which makes every slot true, resets it.
	own uint32
	// uid and fifo are the owner and identity of an offline claim's FIFO.
	uid  uint32
	fifo ledger.FileID
	// res is the reservation the unit belongs to, whatever its state: a
	// lease or a claim on it ends and the unit is the reservation's again.
	res *reservation
}

type gpuTable struct {
	dev   inventory.Device
	slots []slot
	// dirty says the GPU's part of the view must be built again.
	dirty bool
	// view is the GPU's part of the last published View; built counts how
	// often it was built.
	view  GPUView
	built uint64
}

// View is the table at one moment, published on every change. Nothing in it
// is modified once published: readers (the snapshot, the FUSE view, metrics)
// use it without any lock.
type View struct {
	// Version grows by one with each View published.
	Version uint64
	GPUs    []GPUView
	// Granted and Ended count leases since the Manager was made.
	Granted, Ended uint64
	// Unrecorded says why leases cannot be recorded now (the run dir is
	// full); empty when they can.
	Unrecorded string
	// Reservations are the workflow reservations, by name.
	Reservations []api.Reservation
	// OverQuota are the quotas held above their limit (overquota.go).
	OverQuota []api.QuotaOver
}

// GPUView is one GPU's units.
type GPUView struct {
	// Built counts the builds of the GPU's part of the view: two parts of
	// the same GPU with the same Built are the same, so that a reader may
	// keep what it made of one (the snapshot does).
	Built uint64

	Used, Offline int
	// Reserved counts the units set aside (or held) for reservations and
	// not in use.
	Reserved int
	// HeldMemoryMiB is the GPU memory the GPU's leases, offline claims and
	// reserved units hold (memory.go): asked or not, in use or not.
	HeldMemoryMiB uint64
	// OfflineByUID counts offline units per owner of their FIFO.
	OfflineByUID map[uint32]int
	// Claimed lists the units claimed offline, in unit order.
	Claimed   []OfflineUnit
	Instances []InstanceView
	// Leases are the GPU's live leases, in no order.
	Leases []*api.Lease
	// LeasesHere counts those of Leases whose GPU is this one: a whole-GPU
	// lease is listed on each of its GPUs and counted on its first.
	LeasesHere int
}

// OfflineUnit is one unit claimed offline: its FIFO's owner and identity.
type OfflineUnit struct {
	Instance, Unit int
	UID            uint32
	FIFO           ledger.FileID
}

// InstanceView is one instance's load.
type InstanceView struct {
	// FreeUnits are its free unit indices, ascending; Size how many it owns.
	FreeUnits []int
	Size      int
	// Clients counts one per lease and one per offline unit, since an offline
	// claim's process is unknown.
	Clients int
	// UID is the owner of one of its leases; nil when it has none.
	UID *uint32
	// Users are the uids it serves through leases and offline claims, each
	// once.
	Users []uint32
	// Holds are the units each of Users holds on it: with MPS a user's
	// holds keep others off only as many instances as they fill
	// (placement.Surplus).
	Holds []placement.Hold
	// Reservers are the owners of the reservations that hold units of it,
	// each once.
	Reservers []uint32
	// SlurmJobs are the Slurm jobs of its leases, ascending, each once.
	SlurmJobs []uint64
}

// LeaseCount is how many leases are live in the view.
func (v *View) LeaseCount() int {
	n := 0
	for _, g := range v.GPUs {
		n += g.LeasesHere
	}
	return n
}

// Leases lists every live lease of the view, by id.
func (v *View) Leases() []api.Lease {
	out := make([]api.Lease, 0, v.LeaseCount())
	for gi, g := range v.GPUs {
		for _, l := range g.Leases {
			// A whole-GPU lease is in the list of each of its GPUs.
			if l.GPU.Index == gi {
				out = append(out, *l)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// View returns the table as last published, without taking the lock.
func (m *Manager) View() *View { return m.view.Load() }

// touchLocked marks GPU g's part of the view for building again.
func (m *Manager) touchLocked(g int) {
	m.gpus[g].dirty = true
	m.dirty = true
}

// publisher builds the View from the table and publishes it, and keeps the
// placement engine's view of the node (nodeLocked). It works on the table
// under its lock: the version, dirty marks and node it keeps are the
// table's fields.
type publisher struct{ t *Manager }

// publishLocked builds the parts of the view that changed and publishes a new
// View; it reports whether it did. Only changed GPUs are built again, each in
// time proportional to its units, never to the leases of the node.
func (p *publisher) publishLocked() bool {
	if !p.t.dirty {
		return false
	}
	p.t.dirty = false
	p.t.version++
	v := &View{Version: p.t.version, GPUs: make([]GPUView, len(p.t.gpus)), Granted: p.t.granted, Ended: p.t.ended, Unrecorded: p.t.rec.unrecordedLocked(),
		Reservations: p.t.res.reservationViewsLocked(), OverQuota: p.t.overQuotaLocked()}
	for gi, g := range p.t.gpus {
		if g.dirty {
			g.view = p.buildGPUViewLocked(gi, g)
			g.dirty = false
			g.built++
			g.view.Built = g.built
		}
		v.GPUs[gi] = g.view
	}
	p.t.view.Store(v)
	return true
}

func (p *publisher) buildGPUViewLocked(gi int, g *gpuTable) GPUView {
	// A view is built on every change, so it is built in few allocations:
	// the instances' free units share one array, and both it and the leases'
	// list are as long as the last build's to begin with, and a unit more: a
	// change is mostly one lease of one unit, and on a full GPU an array for
	// every unit was most of the garbage.
	gv := GPUView{Instances: make([]InstanceView, 0, p.t.cfg.Model.InstancesPerGPU), Leases: make([]*api.Lease, 0, len(g.view.Leases)+1)}
	free := make([]int, 0, min(freeUnits(g.view)+1, len(g.slots)))
	// A lease of several units is counted once: marked with this build's
	// number the first time it is met.
	p.t.builds++
	for k := 0; k < p.t.cfg.Model.InstancesPerGPU; k++ {
		start, n := p.t.cfg.Model.InstanceRange(k)
		iv := InstanceView{Size: n}
		first := len(free)
		for u := start; u < start+n; u++ {
			s := &g.slots[u]
			if s.res != nil {
				iv.Reservers = addUser(iv.Reservers, s.res.owner.UID)
			}
			switch s.state {
			case slotFree:
				free = append(free, u)
			case slotReserved:
				gv.Reserved++
			case slotOffline:
				gv.Used++
				gv.Offline++
				iv.Clients++
				if gv.OfflineByUID == nil {
					gv.OfflineByUID = map[uint32]int{}
				}
				gv.OfflineByUID[s.uid]++
				gv.Claimed = append(gv.Claimed, OfflineUnit{Instance: k, Unit: u, UID: s.uid, FIFO: s.fifo})
				iv.Users = addUser(iv.Users, s.uid)
				iv.Holds = addHold(iv.Holds, s.uid)
			case slotBlocked:
				gv.Used++
			case slotLeased:
				gv.Used++
				iv.Holds = addHold(iv.Holds, s.lease.ownerUID)
				if s.lease.seen != p.t.builds {
					s.lease.seen = p.t.builds
					iv.Clients++
					gv.Leases = append(gv.Leases, s.lease.Lease)
					gv.HeldMemoryMiB += s.lease.heldMiB(p.t.cfg.Model.UnitsPerGPU, g.dev.MemoryTotalMiB)
					if s.lease.gpu == gi {
						gv.LeasesHere++
					}
					uid := s.lease.ownerUID
					if iv.UID == nil {
						// Its own variable: were uid's address taken, every
						// lease met would allocate one.
						first := uid
						iv.UID = &first
					}
					iv.Users = addUser(iv.Users, uid)
					if s.lease.slurm != nil {
						iv.SlurmJobs = addSlurmJob(iv.SlurmJobs, s.lease.slurm.JobID)
					}
				}
			}
		}
		iv.FreeUnits = free[first:len(free):len(free)]
		gv.Instances = append(gv.Instances, iv)
	}
	gv.HeldMemoryMiB += unitsHeldMiB(gv.Offline+gv.Reserved, p.t.cfg.Model.UnitsPerGPU, g.dev.MemoryTotalMiB)
	return gv
}

// freeUnits counts the free units of a GPU's view.
func freeUnits(gv GPUView) int {
	n := 0
	for _, iv := range gv.Instances {
		n += len(iv.FreeUnits)
	}
	return n
}

// withReservers adds to users (never modifying it) the reservers other than
// except.
func withReservers(users, reservers []uint32, except *uint32) []uint32 {
	copied := false
	for _, uid := range reservers {
		if except != nil && uid == *except || slices.Contains(users, uid) {
			continue
		}
		if !copied {
			users, copied = slices.Clone(users), true
		}
		users = append(users, uid)
	}
	return users
}

func addUser(users []uint32, uid uint32) []uint32 {
	for _, u := range users {
		if u == uid {
			return users
		}
	}
	return append(users, uid)
}

// addHold counts one more unit of uid's in holds.
func addHold(holds []placement.Hold, uid uint32) []placement.Hold {
	for i := range holds {
		if holds[i].UID == uid {
			holds[i].Units++
			return holds
		}
	}
	return append(holds, placement.Hold{UID: uid, Units: 1})
}

// nodeLocked is the placement engine's view of the node: the published table
// and the agent's conditions. Only the manager decides under the lock, so it
// keeps one Node and brings up to date the GPUs whose part of the view, or
// whose conditions, changed since; nothing changes it during a decision.
func (p *publisher) nodeLocked() *placement.Node {
	p.publishLocked()
	cond := p.t.conditions.Load()
	if p.t.node == nil {
		p.t.node = &placement.Node{ClientsPerInstance: p.t.cfg.Model.ClientsPerInstance, OneUserPerInstance: p.t.cfg.MPS, GPUs: make([]placement.GPU, len(p.t.gpus))}
		p.t.nodeBuilt = make([]uint64, len(p.t.gpus))
	}
	n := p.t.node
	all := cond != p.t.nodeCond
	p.t.nodeCond = cond
	n.Draining = cond != nil && cond.Draining
	for gi, g := range p.t.gpus {
		if !all && p.t.nodeBuilt[gi] == g.built {
			continue
		}
		p.t.nodeBuilt[gi] = g.built
		p.placementGPU(&n.GPUs[gi], g, gpuCondition(cond, gi), nil)
	}
	return n
}

// gpuCondition is GPU gi's part of c; nil when c says nothing of it.
func gpuCondition(c *Conditions, gi int) *GPUCondition {
	if c == nil || gi >= len(c.GPUs) {
		return nil
	}
	return &c.GPUs[gi]
}

// placementGPU brings pg, GPU g's part of the placement view, up to date.
// Its free memory is what the GPU's leases, claims and reserved units do not
// hold, less what runs beside gpulet (memoryFreeMiB).
// With MPS, an instance holding units of a reservation counts the
// reservation's owner among its users (but not the uid except, when set):
// other users' leases keep out of it, so that the owner's draws find it
// theirs.
func (p *publisher) placementGPU(pg *placement.GPU, g *gpuTable, gc *GPUCondition, except *uint32) {
	gv := &g.view
	*pg = placement.GPU{
		Index: g.dev.Index, UUID: g.dev.UUID, Name: g.dev.Name,
		MemoryTotalMiB: g.dev.MemoryTotalMiB,
		Free:           p.t.cfg.Model.UnitsPerGPU - gv.Used - gv.Reserved, Units: p.t.cfg.Model.UnitsPerGPU, Instances: pg.Instances[:0],
		Card: placement.Card{CC: g.dev.CC(), MemoryBandwidthGBps: g.dev.MemoryBandwidthGBps(), SMClockMHz: g.dev.MaxSMClockMHz},
	}
	if gc != nil {
		pg.Unusable = gc.Unusable
	}
	pg.MemoryFreeMiB = memoryFreeMiB(g, gc, 0)
	for k, iv := range gv.Instances {
		in := placement.Instance{Index: k, FreeUnits: iv.FreeUnits, Size: iv.Size, Clients: iv.Clients, Users: iv.Users, Holds: iv.Holds}
		if gc != nil && k < len(gc.InstanceDown) {
			in.Down = gc.InstanceDown[k]
		}
		if gc != nil && k < len(gc.ServerUID) && gc.ServerUID[k] != nil {
			in.Users = addUser(append([]uint32(nil), iv.Users...), *gc.ServerUID[k])
		}
		if p.t.cfg.MPS {
			in.Users = withReservers(in.Users, iv.Reservers, except)
		}
		pg.Instances = append(pg.Instances, in)
	}
}

func (m *Manager) visible(peer identity.Peer, l *lease) bool {
	return peer.Admin || peer.UID == 0 || peer.UID == l.Owner.UID
}

// Get returns lease id if peer may see it.
func (m *Manager) Get(peer identity.Peer, id string) (api.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		return api.Lease{}, errdefs.Errorf(errdefs.ErrNotFound, "no lease %q", id)
	}
	return *l.Lease, nil
}

// List returns the leases peer may see, by id.
func (m *Manager) List(peer identity.Peer) []api.Lease {
	m.mu.Lock()
	out := []api.Lease{}
	for _, l := range m.leases {
		if m.visible(peer, l) {
			out = append(out, *l.Lease)
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// eachLeaseLocked calls fn with every live lease, in no order, until fn
// returns false.
func (m *Manager) eachLeaseLocked(fn func(*lease) bool) {
	for _, l := range m.leases {
		if !fn(l) {
			return
		}
	}
}
