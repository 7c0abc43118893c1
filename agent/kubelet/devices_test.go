package kubelet

import (
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

func testDevices() *devices {
	return newDevices([]inventory.Device{
		{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", NUMANode: 1},
		{Index: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", NUMANode: -1},
	}, 4)
}

func TestDeviceIDsRoundTrip(t *testing.T) {
	d := testDevices()
	for i, id := range d.ids {
		u, err := d.unit(id)
		if err != nil || u.GPU != i/4 || u.Index != i%4 || len(id) > 63 {
			t.Fatalf("%s: unit %v, %v", id, u, err)
		}
	}
	for _, bad := range []string{"", "GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000000-4",
		"GPU-00000000-0000-0000-0000-000000000000-01", "GPU-00000000-0000-0000-0000-000000000000--1", strings.Repeat("x", 4096)} {
		if _, err := d.unit(bad); err == nil || len(err.Error()) > 200 {
			t.Fatalf("%.40q: %v", bad, err)
		}
	}
	if l := d.list(make([]bool, 8)); l.Devices[0].Topology.GetNodes()[0].GetID() != 1 || l.Devices[4].Topology != nil {
		t.Fatalf("topology %v / %v", l.Devices[0].Topology, l.Devices[4].Topology)
	}
}

// FuzzDeviceUnit: an id from the kubelet names a unit only when it is exactly
// the id this node gives that unit; anything else is refused with a short
// message.
func FuzzDeviceUnit(f *testing.F) {
	d := testDevices()
	for _, s := range []string{d.ids[0], d.ids[7], "GPU-11111111-1111-1111-1111-111111111111-3\x00", "-1", "GPU--0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		u, err := d.unit(id)
		if err != nil {
			if len(err.Error()) > 200 {
				t.Fatalf("message of %d bytes", len(err.Error()))
			}
			return
		}
		if DeviceID([]string{"GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"}[u.GPU], u.Index) != id {
			t.Fatalf("%q names unit %v, whose id differs", id, u)
		}
	})
}

func TestHealth(t *testing.T) {
	d := testDevices()
	pod := &api.Lease{Binding: "pod", Instance: 1, Units: []int{2}}
	gpurun := &api.Lease{Binding: "pid", Instance: 0, Units: []int{1}}
	view := func(unrecorded string) *lease.View {
		return &lease.View{Unrecorded: unrecorded, GPUs: []lease.GPUView{
			{Instances: []lease.InstanceView{{FreeUnits: []int{0}}, {FreeUnits: []int{3}}}, Leases: []*api.Lease{pod, gpurun}},
			{Instances: []lease.InstanceView{{FreeUnits: []int{0, 1}}, {FreeUnits: []int{2, 3}}}},
		}}
	}
	for _, c := range []struct {
		name string
		view *lease.View
		cond *lease.Conditions
		want string // per device: + healthy, - not
	}{
		{"no conditions", view(""), nil, "+-++ ++++"},
		{"busy GPU", view(""), &lease.Conditions{GPUs: []lease.GPUCondition{{}, {Unusable: "is 99% busy"}}}, "+-++ ----"},
		{"instance down", view(""), &lease.Conditions{GPUs: []lease.GPUCondition{{InstanceDown: []string{"", "is down"}}, {}}}, "+--- ++++"},
		{"draining", view(""), &lease.Conditions{Draining: true}, "---- ----"},
		{"journal full", view("cannot record leases"), nil, "---- ----"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := d.health(c.view, c.cond, func(lease.InstanceView) bool { return true })
			var got strings.Builder
			for i, ok := range h {
				if i == 4 {
					got.WriteByte(' ')
				}
				if ok {
					got.WriteByte('+')
				} else {
					got.WriteByte('-')
				}
			}
			if got.String() != c.want {
				t.Fatalf("health %s, want %s", got.String(), c.want)
			}
		})
	}
}
