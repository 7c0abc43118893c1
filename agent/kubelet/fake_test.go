package kubelet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// fakeLeases is a map-backed PodLeases: it grants whatever it is asked,
// except the units listed in refuse, and records what the plugin asked, so
// that the plugin's own logic is tested without the lease engine.
type fakeLeases struct {
	mu     sync.Mutex
	refuse map[lease.Unit]bool
	// byUnits is the pod lease granted for each set of units (their key).
	byUnits map[string]lease.Grant
	ended   []string
	next    int
}

func newFakeLeases() *fakeLeases {
	return &fakeLeases{refuse: map[lease.Unit]bool{}, byUnits: map[string]lease.Grant{}}
}

func unitsKey(units []lease.Unit) string { return fmt.Sprint(units) }

func (f *fakeLeases) View() *lease.View                  { return &lease.View{} }
func (f *fakeLeases) PodMayJoin(lease.InstanceView) bool { return true }
func (f *fakeLeases) SetPod(string, api.LeasePod)        {}

func (f *fakeLeases) PreferPod(available, must []lease.Unit, size int) ([]lease.Unit, error) {
	return append(slices.Clone(must), available...)[:size], nil
}

func (f *fakeLeases) GrantPod(units []lease.Unit, pod api.LeasePod) (lease.Grant, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range units {
		if f.refuse[u] {
			return lease.Grant{}, false, api.Errorf(api.ErrInsufficientUnits, "unit %d of GPU %d is held outside Kubernetes", u.Index, u.GPU)
		}
	}
	if g, ok := f.byUnits[unitsKey(units)]; ok {
		return g, true, nil
	}
	f.next++
	g := lease.Grant{Lease: api.Lease{ID: fmt.Sprintf("lease-%d", f.next), GPU: api.LeaseGPU{Index: units[0].GPU, UUID: "GPU-fake"},
		Env: map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, Pod: &pod}}
	f.byUnits[unitsKey(units)] = g
	return g, false, nil
}

func (f *fakeLeases) AdoptPod(units []lease.Unit, pod api.LeasePod) (lease.Grant, error) {
	g, _, err := f.GrantPod(units, pod)
	return g, err
}

func (f *fakeLeases) EndPod(id, _ string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, g := range f.byUnits {
		if g.ID == id {
			delete(f.byUnits, k)
			f.ended = append(f.ended, id)
			return true
		}
	}
	return false
}

// TestRefusedAllocationEndsOnlyTheLeasesItMade: a kubelet allocation of three
// containers whose third is refused ends the lease it granted for the first,
// keeps the lease the second reused (another container's, asked again), and
// answers with the refusal's gRPC code, naming the container.
func TestRefusedAllocationEndsOnlyTheLeasesItMade(t *testing.T) {
	sim := inventory.NewSim("test", []inventory.Model{inventory.Models[5]})
	devs := sim.Devices()
	fake := newFakeLeases()
	p := newPlugin(Config{Leases: fake, Devices: devs, UnitsPerGPU: 16, Logger: quiet()})
	id := func(i int) string { return DeviceID(devs[0].UUID, i) }

	reused, _, err := fake.GrantPod([]lease.Unit{{GPU: 0, Index: 4}}, api.LeasePod{})
	if err != nil {
		t.Fatal(err)
	}
	fake.refuse[lease.Unit{GPU: 0, Index: 9}] = true
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{id(0), id(1)}}, {DevicesIds: []string{id(4)}}, {DevicesIds: []string{id(9)}},
	}}
	_, err = p.Allocate(context.Background(), req)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ResourceExhausted", err)
	}
	if !strings.Contains(err.Error(), "container 2") {
		t.Fatalf("err = %v, want it to name container 2", err)
	}
	if len(fake.ended) != 1 || fake.ended[0] == reused.ID {
		t.Fatalf("ended %v: want only the first container's new lease, not the reused %s", fake.ended, reused.ID)
	}
	if _, ok := fake.byUnits[unitsKey([]lease.Unit{{GPU: 0, Index: 4}})]; !ok {
		t.Fatal("the reused lease was ended")
	}
}

// TestAllocateAnswersTheLeasesEnvironment: each container gets its lease's
// environment, its id and the GPU's UUID as NVIDIA_VISIBLE_DEVICES.
func TestAllocateAnswersTheLeasesEnvironment(t *testing.T) {
	sim := inventory.NewSim("test", []inventory.Model{inventory.Models[5]})
	devs := sim.Devices()
	p := newPlugin(Config{Leases: newFakeLeases(), Devices: devs, UnitsPerGPU: 16, Logger: quiet()})
	resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{DeviceID(devs[0].UUID, 2)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	env := resp.ContainerResponses[0].Envs
	if env["GPULET_LEASE_ID"] != "lease-1" || env[envNvidiaVisible] != "GPU-fake" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" {
		t.Fatalf("env = %v", env)
	}
}
