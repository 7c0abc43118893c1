package kubelet

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// The kubelet never says when a pod ends: the plugin asks its pod-resources
// API every Interval which devices containers hold, and
//
//   - ends a pod lease none of whose units any container holds, once two
//     Lists in a row have missed it (a List may begin before the kubelet has
//     recorded an allocation it just made). Lists taken within two intervals
//     of gpuletd's start or of the kubelet's restart (its socket made anew,
//     or this API answering after failing) do not count: a kubelet coming up
//     lists its pods as it learns them again. A pod that ends is
//     thus released within two intervals, four after a restart;
//   - names the container that holds each pod lease;
//   - makes a pod lease for units that a container holds and no lease does
//     (the run dir was lost with a reboot, or gpuletd ran without the
//     plugin): what runs is recorded.
//
// A List that fails changes nothing.

// maxListBytes bounds one List answer; the kubelet's own server allows as
// much.
const maxListBytes = 16 << 20

// listTimeout bounds one List call.
const listTimeout = 10 * time.Second

// missesToRelease is how many Lists in a row must miss a lease's units.
const missesToRelease = 2

// reconciler is the reconcile's memory from one List to the next; only the
// reconcile goroutine uses it.
type reconciler struct {
	// misses counts, per pod lease, the Lists in a row that missed it.
	misses map[string]int
	// failing says the last List failed (said once, until one works).
	failing bool
	// warned are the conflicts already logged, by device ids, so that one
	// that stays is said once rather than every interval.
	warned map[string]bool
}

func (p *Plugin) reconcileLoop() {
	conn, err := grpc.NewClient("unix://"+p.cfg.PodResourcesSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxListBytes)))
	if err != nil {
		p.log.Error("cannot reach the kubelet's pod-resources API: pod leases are not released", "socket", p.cfg.PodResourcesSocket, "err", err)
		return
	}
	defer conn.Close()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	r := &reconciler{misses: map[string]int{}, warned: map[string]bool{}}
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	for {
		p.reconcile(client, r)
		select {
		case <-tick.C:
		case <-p.ctx.Done():
			return
		}
	}
}

// heldUnits is what one List says: for each container that holds units of
// this node, its units and who it is.
type heldUnits struct {
	units []lease.Unit
	pod   api.LeasePod
}

// reconcile does one List and acts on it.
func (p *Plugin) reconcile(client podresourcesapi.PodResourcesListerClient, r *reconciler) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, listTimeout)
	resp, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	cancel()
	if err != nil {
		if p.ctx.Err() == nil && !r.failing {
			p.log.Warn("the kubelet's pod-resources API does not answer: no pod lease is released until it does", "socket", p.cfg.PodResourcesSocket, "err", err)
		}
		r.failing = true
		return
	}
	if r.failing {
		// A kubelet (re)starting serves this API at once, before it
		// has learnt its pods again and before it makes the socket the
		// registrar watches for: this List is the first sign of it.
		p.log.Info("the kubelet's pod-resources API answers again", "socket", p.cfg.PodResourcesSocket)
		r.failing = false
		p.settle()
	}
	containers, unknown := p.heldBy(resp)
	if unknown != "" {
		p.errLines.Log(slog.LevelWarn, "the kubelet lists a device of "+ResourceName+" that this node does not have", "device", clip(unknown))
	}
	held := map[lease.Unit]bool{}
	seen := map[string]bool{}
	for _, c := range containers {
		for _, u := range c.units {
			held[u] = true
		}
		key := strings.Join(c.pod.Devices, ",")
		seen[key] = true
		p.record(c, key, r)
	}
	for key := range r.warned {
		if !seen[key] {
			delete(r.warned, key)
		}
	}
	p.release(held, start, r)
}

// heldBy picks the containers that hold this node's units out of a List
// answer; unknown is a device id of the resource that no unit has, if any.
func (p *Plugin) heldBy(resp *podresourcesapi.ListPodResourcesResponse) (out []heldUnits, unknown string) {
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			var h heldUnits
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != ResourceName {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					u, err := p.devs.unit(id)
					if err != nil {
						unknown = id
						continue
					}
					h.units = append(h.units, u)
					h.pod.Devices = append(h.pod.Devices, id)
				}
			}
			if len(h.units) == 0 {
				continue
			}
			h.pod.Namespace, h.pod.Name, h.pod.Container = pod.GetNamespace(), pod.GetName(), c.GetName()
			out = append(out, h)
		}
	}
	return out, unknown
}

// record names the container of the pod lease that holds exactly its units,
// or, when no lease holds any of them, makes one. Anything else (units that
// a lease outside Kubernetes or an offline claim holds, units split between
// leases) is a conflict the plugin cannot mend: it is logged once.
func (p *Plugin) record(c heldUnits, key string, r *reconciler) {
	v := p.cfg.Leases.View()
	holders := leasesHolding(v, c.units)
	switch {
	case len(holders) == 1 && holders[0].Binding == string(lease.KindPod) && sameUnits(holders[0], c.units):
		if l := holders[0]; l.Pod == nil || l.Pod.Namespace != c.pod.Namespace || l.Pod.Name != c.pod.Name || l.Pod.Container != c.pod.Container {
			p.cfg.Leases.SetPod(l.ID, c.pod)
		}
		return
	case len(holders) == 0:
		g, err := p.cfg.Leases.AdoptPod(c.units, c.pod)
		if err == nil {
			p.log.Info("pod lease rebuilt from the kubelet's pod-resources API", "lease", g.ID, "pod", c.pod.Namespace+"/"+c.pod.Name,
				"container", c.pod.Container, "gpu", g.GPU.Index, "units", g.Units)
			return
		}
		if !r.warned[key] {
			p.log.Warn("the kubelet lists units for a container that cannot be recorded as a lease", "pod", c.pod.Namespace+"/"+c.pod.Name,
				"container", c.pod.Container, "devices", key, "err", err)
		}
	default:
		if !r.warned[key] {
			ids := make([]string, len(holders))
			for i, l := range holders {
				ids[i] = l.ID + " (" + l.Binding + ")"
			}
			p.log.Warn("the kubelet lists units for a container that other leases hold", "pod", c.pod.Namespace+"/"+c.pod.Name,
				"container", c.pod.Container, "devices", key, "leases", strings.Join(ids, ", "))
		}
	}
	r.warned[key] = true
}

// release ends the pod leases that this List, and the one before it, missed.
func (p *Plugin) release(held map[lease.Unit]bool, start time.Time, r *reconciler) {
	counts := p.settled(start)
	live := map[string]bool{}
	for _, g := range p.cfg.Leases.View().GPUs {
		for _, l := range g.Leases {
			if l.Binding != string(lease.KindPod) {
				continue
			}
			live[l.ID] = true
			if holdsAny(held, l) {
				delete(r.misses, l.ID)
				continue
			}
			// A lease granted after the List began cannot be in it, nor can
			// one that Allocate answered with since: that is a new pod
			// given a gone one's devices, and its misses start over.
			if !p.lastAllocated(l.ID, l.Created).Before(start) {
				delete(r.misses, l.ID)
				continue
			}
			if !counts {
				continue
			}
			if r.misses[l.ID]++; r.misses[l.ID] < missesToRelease {
				continue
			}
			delete(r.misses, l.ID)
			if p.cfg.Leases.EndPod(l.ID, "the kubelet lists no container holding its devices") {
				p.log.Info("pod lease released: its pod is gone", "lease", l.ID, "pod", podName(l.Pod))
			}
		}
	}
	for id := range r.misses {
		if !live[id] {
			delete(r.misses, id)
		}
	}
	p.forgetAllocated(live)
}

func podName(p *api.LeasePod) string {
	if p == nil || p.Name == "" {
		return "unknown"
	}
	return p.Namespace + "/" + p.Name
}

// leasesHolding lists the leases that hold any of units, each once.
func leasesHolding(v *lease.View, units []lease.Unit) []*api.Lease {
	var out []*api.Lease
	for _, u := range units {
		if u.GPU >= len(v.GPUs) {
			continue
		}
		for _, l := range v.GPUs[u.GPU].Leases {
			if slices.Contains(l.Units, u.Index) && !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// sameUnits says whether lease l holds exactly units.
func sameUnits(l *api.Lease, units []lease.Unit) bool {
	if len(l.Units) != len(units) {
		return false
	}
	for _, u := range units {
		if u.GPU != l.GPU.Index || !slices.Contains(l.Units, u.Index) {
			return false
		}
	}
	return true
}

func holdsAny(held map[lease.Unit]bool, l *api.Lease) bool {
	for _, u := range l.Units {
		if held[lease.Unit{GPU: l.GPU.Index, Index: u}] {
			return true
		}
	}
	return false
}
