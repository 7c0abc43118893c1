package lease

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// This file is the Manager's side of Kubernetes: leases of kind pod, which
// the kubelet plugin (agent/kubelet) makes when the kubelet allocates units to
// a container and ends when the kubelet no longer lists them. They share the
// table, the ledger, the journal and the placement engine with every other
// lease; only what ends them differs.

// KindPod: the lease ends when the kubelet's pod-resources API no longer
// lists its devices; the kubelet plugin ends it (EndPod).
const KindPod Kind = "pod"

// Pods is the pod-lease feature: what the kubelet plugin calls. It keeps no
// state of its own (a pod lease is a table lease bound to nothing the table
// watches) and works on the table under its lock.
type Pods struct{ t *Manager }

// Pods is the table's pod-lease feature.
func (m *Manager) Pods() *Pods { return &Pods{t: m} }

// View is the table's published view, which the kubelet plugin reads for
// health and to reconcile.
func (p *Pods) View() *View { return p.t.View() }

// podBinding holds nothing: no process, no timer. The kubelet plugin's
// reconcile ends the lease.
type podBinding struct{}

func (podBinding) kind() Kind                 { return KindPod }
func (podBinding) armLocked(*Manager, *lease) {}
func (podBinding) release()                   {}

// Unit names one unit of the node: its GPU's index and its index on the GPU.
type Unit struct {
	GPU, Index int
}

// podPeer is who a pod lease belongs to: the kubelet, which runs as root and
// allocates for every pod.
// It acts as an admin: Kubernetes decides which pods run here and applies
// its own quotas, so gpulet's pools and quotas do not bind pods.
var podPeer = identity.Peer{UID: 0, GID: 0, Admin: true}

// PodMayJoin reports whether an instance as iv shows it could take a pod's
// lease now, as far as its clients go: it has room for another MPS client,
// and with MPS on it serves no user but pods' (placement's instanceNow, which
// refuses Allocate otherwise). The kubelet is told its free units only where
// this holds, so that it counts no unit a pod could not be given.
func (p *Pods) PodMayJoin(iv InstanceView) bool {
	if iv.Clients >= p.t.cfg.Model.ClientsPerInstance {
		return false
	}
	return !p.t.cfg.MPS || !placement.ServesOthers(iv.Users, podPeer.UID)
}

// PreferPod says which size units of available a container should get, and
// must include mustInclude: the placement engine's choice on the node as it
// is now, as POST /v1/leases would place a request of size units, with the
// free units cut down to those the kubelet offers. Units of pod leases that
// the kubelet offers count as free: it offers only what no running container
// holds. It commits nothing.
func (p *Pods) PreferPod(available, mustInclude []Unit, size int) ([]Unit, error) {
	if err := p.checkPodSize(size); err != nil {
		return nil, err
	}
	if len(mustInclude) > size {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "%d device(s) must be included in an allocation of %d", len(mustInclude), size)
	}
	offered := map[Unit]bool{}
	for _, u := range available {
		if err := p.checkUnit(u); err != nil {
			return nil, err
		}
		offered[u] = true
	}
	for _, u := range mustInclude {
		if err := p.checkUnit(u); err != nil {
			return nil, err
		}
		offered[u] = true
	}
	gpu, instance := -1, -1
	if len(mustInclude) > 0 {
		gpu, instance = mustInclude[0].GPU, p.t.cfg.Model.InstanceOf(mustInclude[0].Index)
		for _, u := range mustInclude[1:] {
			if u.GPU != gpu || p.t.cfg.Model.InstanceOf(u.Index) != instance {
				return nil, errdefs.Errorf(errdefs.ErrInvalid, "the devices that must be included lie on more than one GPU or MPS instance; a container's units share one of each")
			}
		}
	}
	if !p.t.lockOpen() {
		return nil, errStopping
	}
	defer p.t.unlock()
	for _, u := range mustInclude {
		if !p.podMayTakeLocked(u) {
			return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "unit %d of GPU %d, which must be included, is held outside Kubernetes", u.Index, u.GPU)
		}
	}
	n := p.offeredNodeLocked(offered, mustInclude, gpu, instance)
	req := p.t.placementRequest(podPeer, Request{LeaseRequest: api.LeaseRequest{Units: size}})
	if gpu >= 0 {
		req.GPU = strconv.Itoa(p.t.gpus[gpu].dev.Index)
	}
	d, err := p.t.engine.Load().Place(n, req)
	if err != nil {
		return nil, err
	}
	out := make([]Unit, len(d.Choice.Units))
	for i, u := range d.Choice.Units {
		out[i] = Unit{GPU: d.Choice.GPU, Index: u}
	}
	slices.SortFunc(out, func(a, b Unit) int { return a.Index - b.Index })
	return out, nil
}

// offeredNodeLocked is the placement view of the node with each instance's
// free units cut down to those offered, the units of must first (the engine
// takes an instance's first free units). With gpu ≥ 0 only that GPU's
// instance is open; the others are down for the decision.
func (p *Pods) offeredNodeLocked(offered map[Unit]bool, must []Unit, gpu, instance int) *placement.Node {
	base := p.t.pub.nodeLocked()
	n := *base
	n.GPUs = make([]placement.GPU, len(base.GPUs))
	for gi := range base.GPUs {
		g := base.GPUs[gi]
		g.Instances = make([]placement.Instance, len(base.GPUs[gi].Instances))
		g.Free = 0
		for k, in := range base.GPUs[gi].Instances {
			free := make([]int, 0, len(in.FreeUnits))
			for _, u := range must {
				if u.GPU == gi && p.t.cfg.Model.InstanceOf(u.Index) == k && p.podMayTakeLocked(u) {
					free = append(free, u.Index)
				}
			}
			start, size := p.t.cfg.Model.InstanceRange(k)
			for i := start; i < start+size; i++ {
				u := Unit{gi, i}
				if offered[u] && !slices.Contains(free, i) && p.podMayTakeLocked(u) {
					free = append(free, i)
				}
			}
			in.FreeUnits = free
			if gpu >= 0 && (gi != gpu || k != instance) {
				in.Down = "does not hold the devices the kubelet must include"
			}
			g.Instances[k] = in
			g.Free += len(free)
		}
		n.GPUs[gi] = g
	}
	return &n
}

// podMayTakeLocked says whether a pod may be given unit u: it is free, or a
// pod lease holds it (which the kubelet, offering it, no longer counts).
func (p *Pods) podMayTakeLocked(u Unit) bool {
	s := &p.t.gpus[u.GPU].slots[u.Index]
	return s.state == slotFree || s.state == slotLeased && s.lease.Binding == string(KindPod)
}

// GrantPod leases exactly units to a container, as the kubelet's Allocate
// names them: on one GPU and one MPS instance, at most --units-per-client,
// each free now, and allowed by the placement engine as a lease of those
// units would be (the GPU eligible, the instance up, room for a client, the
// node not draining). Units that pod leases hold are the kubelet's to give
// again: it does so only once their containers are gone, so those leases end
// first. When units are exactly one pod lease's, that lease is the answer
// (the kubelet asking again); reused says so. pod.Devices are the kubelet's
// ids of units.
func (p *Pods) GrantPod(units []Unit, pod api.LeasePod) (g Grant, reused bool, err error) {
	if err := p.checkPodSize(len(units)); err != nil {
		return Grant{}, false, err
	}
	return p.podLease(units, pod, false)
}

// AdoptPod makes a pod lease for units that the kubelet lists as held by a
// running container although no lease holds them (the journal was lost, or
// gpuletd ran without the plugin): what already runs is recorded, so neither
// the placement engine's conditions nor --units-per-client apply. When the
// units are exactly one pod lease's, that lease is the answer. Units held
// otherwise (another pod lease, a lease that is not a pod's, an offline
// claim) are refused: unlike Allocate, a listing names no new owner.
func (p *Pods) AdoptPod(units []Unit, pod api.LeasePod) (Grant, error) {
	g, _, err := p.podLease(units, pod, true)
	return g, err
}

func (p *Pods) checkPodSize(n int) error {
	if n < 1 {
		return errdefs.Errorf(errdefs.ErrInvalid, "no devices asked for")
	}
	if M := p.t.cfg.Model.UnitsPerClient; n > M {
		return errdefs.Errorf(errdefs.ErrInvalid, "%d units asked for one container; one client may hold at most %d (--units-per-client)", n, M)
	}
	return nil
}

func (p *Pods) checkUnit(u Unit) error {
	if u.GPU < 0 || u.GPU >= len(p.t.gpus) || u.Index < 0 || u.Index >= p.t.cfg.Model.UnitsPerGPU {
		return errdefs.Errorf(errdefs.ErrInvalid, "no unit %d on GPU %d on this node", u.Index, u.GPU)
	}
	return nil
}

// podLease is GrantPod and AdoptPod: adopt skips the placement engine.
func (p *Pods) podLease(units []Unit, pod api.LeasePod, adopt bool) (Grant, bool, error) {
	if len(units) == 0 {
		return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "no devices asked for")
	}
	gpu, instance := units[0].GPU, -1
	seen := map[int]bool{}
	for _, u := range units {
		if err := p.checkUnit(u); err != nil {
			return Grant{}, false, err
		}
		if u.GPU != gpu {
			return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "the devices lie on GPUs %d and %d: a container's units must all be on one GPU", gpu, u.GPU)
		}
		k := p.t.cfg.Model.InstanceOf(u.Index)
		if instance >= 0 && k != instance {
			return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "the devices lie on MPS instances %d and %d of GPU %d: a container's units must all be on one instance", instance, k, gpu)
		}
		instance = k
		if seen[u.Index] {
			return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "unit %d of GPU %d is named twice", u.Index, gpu)
		}
		seen[u.Index] = true
	}
	idx := make([]int, 0, len(units))
	for _, u := range units {
		idx = append(idx, u.Index)
	}
	slices.Sort(idx)
	if !p.t.lockOpen() {
		return Grant{}, false, errStopping
	}
	if p.t.journal.Failed() != nil {
		p.t.unlock()
		return Grant{}, false, unrecorded("no lease is granted", p.t.journal.Failed())
	}
	stale, err := p.podHoldersLocked(gpu, idx)
	if err != nil {
		p.t.unlock()
		return Grant{}, false, err
	}
	if len(stale) == 1 && slices.Equal(stale[0].Units, idx) {
		l := stale[0]
		p.setPodLocked(l, pod)
		g := l.grant()
		p.t.unlock()
		return g, true, nil
	}
	if adopt && len(stale) > 0 {
		p.t.unlock()
		return Grant{}, false, errdefs.Errorf(errdefs.ErrNoCapacity, "units %v of GPU %d overlap those of pod lease %s (%v)", idx, gpu, stale[0].ID, stale[0].Units)
	}
	for _, l := range stale {
		if err := p.supersedeLocked(l); err != nil {
			p.t.unlock()
			return Grant{}, false, unrecorded("no lease is granted", err)
		}
	}
	l, err := p.grantPodLocked(gpu, instance, idx, pod, adopt)
	var g Grant
	if err == nil {
		g = l.grant()
	}
	// Units a superseded lease gave back and this grant did not take.
	if len(stale) > 0 {
		p.t.serveWaitersLocked()
	}
	p.t.unlock()
	return g, false, err
}

// podHoldersLocked returns the pod leases that hold units idx of GPU g, or
// an error naming the first unit held otherwise.
func (p *Pods) podHoldersLocked(g int, idx []int) ([]*lease, error) {
	var out []*lease
	for _, i := range idx {
		s := &p.t.gpus[g].slots[i]
		switch s.state {
		case slotFree:
		case slotLeased:
			if s.lease.Binding != string(KindPod) {
				return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "unit %d of GPU %d is held by lease %s (binding %s), outside Kubernetes", i, g, s.lease.ID, s.lease.Binding)
			}
			if !slices.Contains(out, s.lease) {
				out = append(out, s.lease)
			}
		case slotOffline:
			return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "unit %d of GPU %d is claimed offline by uid %d, outside Kubernetes", i, g, s.uid)
		case slotReserved:
			return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "unit %d of GPU %d is set aside for workflow reservation %s", i, g, s.res.Name)
		default:
			return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "unit %d of GPU %d is blocked by a file that is no claim, until the ledger's sweep removes it", i, g)
		}
	}
	return out, nil
}

// supersedeLocked ends a pod lease whose units the kubelet allocates again.
// Unlike other ends it serves no waiter: the units are about to be taken.
func (p *Pods) supersedeLocked(l *lease) error {
	delete(p.t.leases, l.ID)
	if err := p.t.rec.recordLocked(journal.Record{Op: journal.OpEnd, ID: l.ID}); err != nil {
		p.t.leases[l.ID] = l
		return err
	}
	p.t.dropLocked(l)
	p.t.ended++
	if p.t.lines.due() {
		p.t.infoLocked("lease ended", slog.String("lease", l.ID), slog.String("reason", "the kubelet allocated its devices again"))
	}
	return nil
}

// grantPodLocked places (unless adopt) and commits a pod lease of units idx
// of instance k of GPU g.
func (p *Pods) grantPodLocked(g, k int, idx []int, pod api.LeasePod, adopt bool) (*lease, error) {
	if !adopt {
		if err := p.checkPlacementLocked(g, k, idx); err != nil {
			return nil, err
		}
	}
	c := placement.Choice{GPU: g, Instance: k, Units: idx}
	retry, err := p.t.fifos.createUnitsLocked(g, idx)
	if err != nil {
		return nil, err
	}
	if retry {
		return nil, errdefs.Errorf(errdefs.ErrNoCapacity, "a unit of GPU %d among %v was claimed outside Kubernetes just now", g, idx)
	}
	l := p.t.newLease(podPeer, Request{LeaseRequest: api.LeaseRequest{Units: len(idx)}}, podBinding{}, c, nil)
	pod.Devices = slices.Clone(pod.Devices)
	// Set in place: nothing holds the new lease's value yet.
	l.Lease.Pod = &pod
	p.t.addLocked(l)
	if err := p.t.rec.recordLocked(journal.Record{Op: journal.OpLease, Entry: l.entry(nil)}); err != nil {
		p.t.dropLocked(l)
		return nil, unrecorded("the lease is not granted", err)
	}
	p.t.granted++
	if p.t.lines.due() {
		p.t.infoLocked("lease granted", slog.String("lease", l.ID), slog.Int("gpu", g), slog.Int("instance", k),
			slog.Any("units", idx), slog.String("binding", string(KindPod)), slog.Bool("adopted", adopt))
	}
	return l, nil
}

// checkPlacementLocked asks the placement engine whether a lease of exactly
// units idx of instance k of GPU g may be made now: the same filters as any
// lease, on a node where only those units are free.
func (p *Pods) checkPlacementLocked(g, k int, idx []int) error {
	offered := make(map[Unit]bool, len(idx))
	for _, i := range idx {
		offered[Unit{g, i}] = true
	}
	n := p.offeredNodeLocked(offered, nil, g, k)
	req := p.t.placementRequest(podPeer, Request{LeaseRequest: api.LeaseRequest{Units: len(idx), GPU: strconv.Itoa(p.t.gpus[g].dev.Index)}})
	d, err := p.t.engine.Load().Place(n, req)
	if err != nil {
		return err
	}
	if d.Choice.GPU != g || d.Choice.Instance != k || !slices.Equal(d.Choice.Units, idx) {
		// Cannot happen: only those units are free on the node handed over.
		return fmt.Errorf("placement chose units %v of GPU %d, not the %v asked", d.Choice.Units, d.Choice.GPU, idx)
	}
	return nil
}

// EndPod ends pod lease id, whose devices the kubelet no longer lists, and
// reports whether it did (false: no such pod lease). Like a holder's exit,
// the end happens even when it cannot be recorded.
func (p *Pods) EndPod(id, reason string) bool {
	if !p.t.lockOpen() {
		return false
	}
	defer p.t.unlock()
	l, ok := p.t.leases[id]
	if !ok || l.Binding != string(KindPod) {
		return false
	}
	p.t.dropAndRecordLocked(l, reason, true)
	return true
}

// SetPod names the container that holds pod lease id, as the kubelet's
// pod-resources API lists it; the devices stay as granted. Unknown ids are
// ignored. It is not journaled: the next start learns it from the kubelet
// again.
func (p *Pods) SetPod(id string, pod api.LeasePod) {
	if !p.t.lockOpen() {
		return
	}
	defer p.t.unlock()
	if l, ok := p.t.leases[id]; ok && l.Binding == string(KindPod) {
		p.setPodLocked(l, pod)
	}
}

// setPodLocked sets the container of a pod lease when it differs. The
// lease's LeasePod is replaced, never changed in place: published copies
// share it.
func (p *Pods) setPodLocked(l *lease, pod api.LeasePod) {
	if pod.Name == "" {
		return
	}
	cur := l.Pod
	if cur != nil && cur.Namespace == pod.Namespace && cur.Name == pod.Name && cur.Container == pod.Container {
		return
	}
	next := api.LeasePod{Namespace: pod.Namespace, Name: pod.Name, Container: pod.Container}
	if cur != nil {
		next.Devices = cur.Devices
	}
	l.change(func(pub *api.Lease) { pub.Pod = &next })
	p.t.touchLocked(l.GPU.Index)
}
