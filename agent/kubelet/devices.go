package kubelet

import (
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// DeviceID is the kubelet's id of unit i of the GPU with the given UUID:
// "<gpu-uuid>-<i>" (docs/design.md §14). A GPU UUID is 40 bytes, so ids stay
// within the 63 the device-plugin API allows.
func DeviceID(uuid string, i int) string { return uuid + "-" + strconv.Itoa(i) }

// devices is the node's units as the kubelet knows them: one device per unit,
// in GPU then unit order, fixed for gpuletd's life.
type devices struct {
	unitsPerGPU int
	// ids are the device ids, GPU g's unit i at g*unitsPerGPU+i.
	ids []string
	// units maps each id back to its unit: ids from the kubelet are looked up
	// here, never taken apart, so that only ids this node advertised mean
	// anything.
	units map[string]lease.Unit
	// topology is, per GPU, the hint the kubelet aligns with (its NUMA
	// node); nil when unknown.
	topology []*pluginapi.TopologyInfo
}

func newDevices(devs []inventory.Device, unitsPerGPU int) *devices {
	d := &devices{unitsPerGPU: unitsPerGPU, units: make(map[string]lease.Unit, len(devs)*unitsPerGPU)}
	for g, dev := range devs {
		var topo *pluginapi.TopologyInfo
		if dev.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(dev.NUMANode)}}}
		}
		d.topology = append(d.topology, topo)
		for i := range unitsPerGPU {
			id := DeviceID(dev.UUID, i)
			d.ids = append(d.ids, id)
			d.units[id] = lease.Unit{GPU: g, Index: i}
		}
	}
	return d
}

// unit returns the unit a device id names, or an error naming the id.
func (d *devices) unit(id string) (lease.Unit, error) {
	u, ok := d.units[id]
	if !ok {
		return lease.Unit{}, api.Errorf(api.ErrBadRequest, "device %s is not one of this node's %s devices", clip(id), ResourceName)
	}
	return u, nil
}

// unitsOf looks up every id.
func (d *devices) unitsOf(ids []string) ([]lease.Unit, error) {
	out := make([]lease.Unit, 0, len(ids))
	for _, id := range ids {
		u, err := d.unit(id)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// idsOf is the device ids of units.
func (d *devices) idsOf(units []lease.Unit) []string {
	out := make([]string, len(units))
	for i, u := range units {
		out[i] = d.ids[u.GPU*d.unitsPerGPU+u.Index]
	}
	return out
}

// clip quotes an id from outside for a message, cut short: the kubelet
// passes on what pods and their users wrote.
func clip(s string) string {
	q := strconv.Quote(s)
	if len(q) > 80 {
		return q[:80] + "…"
	}
	return q
}

// health says, per device, whether the kubelet may allocate it: its GPU
// takes leases (eligible, the node neither draining nor unable to record
// leases), its MPS instance is up, and it is a pod's, or free on an instance
// that mayJoin says a pod could join (room for a client, no other user's
// MPS clients). A unit that a lease outside Kubernetes (gpurun, the API)
// holds, that is claimed offline, or that a workflow reservation sets aside,
// is unhealthy: the kubelet must not count it.
func (d *devices) health(v *lease.View, c *lease.Conditions, mayJoin func(lease.InstanceView) bool) []bool {
	out := make([]bool, len(d.ids))
	nodeOK := v.Unrecorded == "" && (c == nil || !c.Draining)
	for g, gv := range v.GPUs {
		var gc *lease.GPUCondition
		if c != nil && g < len(c.GPUs) {
			gc = &c.GPUs[g]
		}
		gpuOK := nodeOK && (gc == nil || gc.Unusable == "")
		up := func(k int) bool {
			return gpuOK && (gc == nil || k >= len(gc.InstanceDown) || gc.InstanceDown[k] == "")
		}
		base := g * d.unitsPerGPU
		for k, iv := range gv.Instances {
			ok := up(k) && mayJoin(iv)
			for _, u := range iv.FreeUnits {
				out[base+u] = ok
			}
		}
		for _, l := range gv.Leases {
			if l.Binding != string(lease.KindPod) {
				continue
			}
			ok := up(l.Instance)
			for _, u := range l.Units {
				out[base+u] = ok
			}
		}
	}
	return out
}

// list is the ListAndWatch answer for health.
func (d *devices) list(health []bool) *pluginapi.ListAndWatchResponse {
	out := make([]*pluginapi.Device, len(d.ids))
	for i, id := range d.ids {
		h := pluginapi.Unhealthy
		if health[i] {
			h = pluginapi.Healthy
		}
		out[i] = &pluginapi.Device{ID: id, Health: h, Topology: d.topology[i/d.unitsPerGPU]}
	}
	return &pluginapi.ListAndWatchResponse{Devices: out}
}
