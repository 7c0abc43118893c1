package dra

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/units"
)

// DriverName is the DRA driver's name: the ResourceSlices' driver, the
// domain of the devices' attributes and capacities, and the CDI vendor.
const DriverName = "gpu.gpulet.io"

// The two kinds of device, the value of the attribute "kind": a share of one
// MPS instance, which many claims share by units and memory (consumable
// capacity), and a whole GPU, which one claim holds alone.
const (
	KindShare = "share"
	KindGPU   = "gpu"
)

// maxCounterSets is the most counter sets one ResourceSlice may hold.
const maxCounterSets = 8

// Node is what the slices are made of: the GPUs, how they are cut, the lease
// table's view and the GPUs' conditions.
type Node struct {
	Devices    []inventory.Device
	Model      units.Model
	MPS        bool
	View       *lease.View
	Conditions *lease.Conditions
}

// ShareName and GPUName are the devices' names in the slices: the MPS
// instance k of the GPU of index g, and the GPU g whole.
func ShareName(g, k int) string { return "gpu-" + strconv.Itoa(g) + "-mps-" + strconv.Itoa(k) }
func GPUName(g int) string      { return "gpu-" + strconv.Itoa(g) }

// ParseDevice reads a device name back: the GPU's index and the instance, or
// -1 for a whole GPU.
func ParseDevice(name string) (gpu, instance int, err error) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return 0, 0, fmt.Errorf("device %q is not one of %s's", name, DriverName)
	}
	gs, ks, share := strings.Cut(rest, "-mps-")
	if gpu, err = strconv.Atoi(gs); err != nil || gpu < 0 || strconv.Itoa(gpu) != gs {
		return 0, 0, fmt.Errorf("device %q is not one of %s's", name, DriverName)
	}
	if !share {
		return gpu, -1, nil
	}
	if instance, err = strconv.Atoi(ks); err != nil || instance < 0 || strconv.Itoa(instance) != ks {
		return 0, 0, fmt.Errorf("device %q is not one of %s's", name, DriverName)
	}
	return gpu, instance, nil
}

// counterSet is the name of GPU g's counter set: it counts the GPU's MPS
// instances. A share device takes one of them while any claim holds it (the
// scheduler charges a device shared by many claims once), the whole GPU
// takes them all: so a GPU is leased whole only while no claim shares it.
func counterSet(g int) string { return "gpu-" + strconv.Itoa(g) }

const counterInstances = "instances"

// Resources is the node's pool, named after the node: a slice of counter sets (one per GPU, at
// most eight to a slice) and a slice of devices. Each GPU gives one share
// device per MPS instance, whose capacity is what Kubernetes may lease of
// it (units that gpurun, offline claims, Slurm or reservations hold are not
// offered), and a whole-GPU device while nothing outside Kubernetes holds a
// unit of it. A GPU that takes no leases (failed, too busy, the node
// draining, leases unrecordable) and an instance that is down offer nothing.
func Resources(pool string, n Node) resourceslice.DriverResources {
	var counters []resourceapi.CounterSet
	var devices []resourceapi.Device
	K := n.Model.InstancesPerGPU
	for gi, dev := range n.Devices {
		counters = append(counters, resourceapi.CounterSet{Name: counterSet(dev.Index), Counters: map[string]resourceapi.Counter{
			counterInstances: {Value: *resource.NewQuantity(int64(K), resource.DecimalSI)},
		}})
		if gi >= len(n.View.GPUs) || !n.usable(gi) {
			continue
		}
		gv := n.View.GPUs[gi]
		outside := 0
		for k, iv := range gv.Instances {
			offered := n.offered(gv, k, iv)
			outside += iv.Size - offered
			if offered == 0 || !n.instanceUp(gi, k) {
				continue
			}
			devices = append(devices, n.share(dev, k, offered, n.userOf(iv)))
		}
		if outside == 0 {
			devices = append(devices, n.whole(dev))
		}
	}
	var slices []resourceslice.Slice
	for len(counters) > 0 {
		k := min(len(counters), maxCounterSets)
		slices = append(slices, resourceslice.Slice{SharedCounters: counters[:k]})
		counters = counters[k:]
	}
	slices = append(slices, resourceslice.Slice{Devices: devices})
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{pool: {Slices: slices}}}
}

// usable says whether GPU gi takes leases at all now.
func (n Node) usable(gi int) bool {
	if n.View.Unrecorded != "" {
		return false
	}
	c := n.Conditions
	if c == nil {
		return true
	}
	return !c.Draining && (gi >= len(c.GPUs) || c.GPUs[gi].Unusable == "")
}

func (n Node) instanceUp(gi, k int) bool {
	c := n.Conditions
	if c == nil || gi >= len(c.GPUs) {
		return true
	}
	down := c.GPUs[gi].InstanceDown
	return k >= len(down) || down[k] == ""
}

// offered counts the units of instance k that Kubernetes may lease: its free
// units and those its claim leases hold (the scheduler counts those itself).
func (n Node) offered(gv lease.GPUView, k int, iv lease.InstanceView) int {
	units := len(iv.FreeUnits)
	for _, l := range gv.Leases {
		if l.Claim != nil && len(l.GPUs) == 0 && l.Instance == k {
			units += len(l.Units)
		}
		if l.Claim != nil && len(l.GPUs) > 0 {
			// A whole GPU leased to a claim: every unit is Kubernetes'.
			units += iv.Size - len(iv.FreeUnits)
			break
		}
	}
	return min(units, iv.Size)
}

// userOf is the attribute "user" of an instance: with MPS on, the uid its
// MPS server serves now ("" while it serves no one), so that a claim can ask
// for an instance that is free or its own user's
// (docs/kubernetes.md, "One user per MPS server"); always "" with MPS off,
// where any user may join any instance.
func (n Node) userOf(iv lease.InstanceView) string {
	if !n.MPS || len(iv.Users) == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(iv.Users[0]), 10)
}

// attributes are a device's attributes, shared by its two kinds.
func (n Node) attributes(dev inventory.Device, kind string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"kind":      {StringValue: ptr.To(kind)},
		"uuid":      {StringValue: ptr.To(dev.UUID)},
		"index":     {IntValue: ptr.To(int64(dev.Index))},
		"model":     {StringValue: ptr.To(dev.Name)},
		"memoryMiB": {IntValue: ptr.To(int64(dev.MemoryTotalMiB))},
		"mps":       {BoolValue: ptr.To(n.MPS && kind == KindShare)},
	}
	if dev.CCMajor > 0 {
		a["computeCapability"] = resourceapi.DeviceAttribute{VersionValue: ptr.To(fmt.Sprintf("%d.%d.0", dev.CCMajor, dev.CCMinor))}
	}
	if dev.NUMANode >= 0 {
		a["numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(dev.NUMANode))}
	}
	return a
}

// share is the device of instance k of dev, offering units of it and their
// share of the GPU's memory. Both capacities have a request policy: one
// without is taken whole by a claim that does not ask for it. A claim asks
// for at most M units, and never more than the capacity (the API server
// refuses a range beyond it).
func (n Node) share(dev inventory.Device, k, units int, user string) resourceapi.Device {
	a := n.attributes(dev, KindShare)
	a["instance"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(k))}
	a["user"] = resourceapi.DeviceAttribute{StringValue: ptr.To(user)}
	memMiB := dev.MemoryTotalMiB * uint64(units) / uint64(n.Model.UnitsPerGPU)
	return resourceapi.Device{
		Name:                     ShareName(dev.Index, k),
		Attributes:               a,
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"units": {
				Value: *resource.NewQuantity(int64(units), resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    resource.NewQuantity(1, resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(1, resource.DecimalSI), Max: resource.NewQuantity(int64(min(n.Model.UnitsPerClient, units)), resource.DecimalSI), Step: resource.NewQuantity(1, resource.DecimalSI)},
				},
			},
			"memory": {
				Value: *resource.NewQuantity(int64(memMiB)<<20, resource.BinarySI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    resource.NewQuantity(0, resource.BinarySI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(0, resource.BinarySI), Step: resource.NewQuantity(1<<20, resource.BinarySI)},
				},
			},
		},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: counterSet(dev.Index), Counters: map[string]resourceapi.Counter{
			counterInstances: {Value: *resource.NewQuantity(1, resource.DecimalSI)},
		}}},
	}
}

// whole is the device of dev leased whole.
func (n Node) whole(dev inventory.Device) resourceapi.Device {
	return resourceapi.Device{
		Name:       GPUName(dev.Index),
		Attributes: n.attributes(dev, KindGPU),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"units":  {Value: *resource.NewQuantity(int64(n.Model.UnitsPerGPU), resource.DecimalSI)},
			"memory": {Value: *resource.NewQuantity(int64(dev.MemoryTotalMiB)<<20, resource.BinarySI)},
		},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: counterSet(dev.Index), Counters: map[string]resourceapi.Counter{
			counterInstances: {Value: *resource.NewQuantity(int64(n.Model.InstancesPerGPU), resource.DecimalSI)},
		}}},
	}
}
