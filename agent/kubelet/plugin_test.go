package kubelet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
	"github.com/gpulet/gpulet/snapshot"
	"github.com/gpulet/gpulet/test/kubelettest"
)

// node is an in-process gpuletd's lease side: two simulated GPUs, a real
// ledger and lease engine, and the snapshot store's change signal.
type node struct {
	devs    []inventory.Device
	model   units.Model
	ledger  *ledger.Ledger
	leases  *lease.Manager
	store   *snapshot.Store
	cond    atomic.Pointer[lease.Conditions]
	kubelet *kubelettest.Kubelet
	plugin  *Plugin
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newNode starts a node with M=2, N=4, K=2 (16 units per GPU, instances
// {0-7} and {8-15}), MPS pipe folders per instance, and the plugin
// registered with a test kubelet.
func newNode(t *testing.T) *node { return newNodeEvery(t, 50*time.Millisecond) }

// newNodeEvery is newNode with the pod-resources API asked every interval.
func newNodeEvery(t *testing.T, interval time.Duration) *node {
	t.Helper()
	model, err := units.New(2, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	sim := inventory.NewSim("test", []inventory.Model{inventory.Models[5], inventory.Models[0]})
	n := &node{devs: sim.Devices(), model: model, store: &snapshot.Store{}}
	var gpus []ledger.GPU
	for _, d := range n.devs {
		gpus = append(gpus, ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name})
	}
	if n.ledger, err = ledger.New(filepath.Join(dir, "run"), model, gpus, -1, quiet()); err != nil {
		t.Fatal(err)
	}
	n.leases, err = lease.New(lease.Config{
		Model: model, Devices: n.devs, Ledger: n.ledger, JournalPath: filepath.Join(dir, "run", "leases.journal"),
		Policy: placement.BestFit, Conditions: n.cond.Load(), OnChange: n.store.Invalidate, MPS: true,
		InstanceEnv: mpsFolders(dir, n.devs, model.InstancesPerGPU),
		Logger:      quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); n.leases.Close(); n.ledger.Close() })
	if err := n.leases.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	n.kubelet = kubelettest.Start(t)
	n.plugin, err = Start(Config{
		Dir: n.kubelet.Dir, PodResourcesSocket: n.kubelet.PodResourcesSocket, Interval: interval,
		Devices: n.devs, UnitsPerGPU: model.UnitsPerGPU, Leases: n.leases.Pods(), Conditions: n.cond.Load,
		Changed: n.store.Changed, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.plugin.Close() })
	n.kubelet.Wait("the plugin's registration and first device list", 10*time.Second, func() bool {
		return len(n.kubelet.Updates()) > 0
	})
	return n
}

// setConditions changes what placement and health read, as the agent does.
// mpsFolders is a lease.Config.InstanceEnv that puts the pipe folder of
// each instance under dir, as gpuletd's run dir holds them.
func mpsFolders(dir string, devs []inventory.Device, instances int) [][]map[string]string {
	out := make([][]map[string]string, len(devs))
	for g, d := range devs {
		for k := range instances {
			out[g] = append(out[g], map[string]string{"CUDA_MPS_PIPE_DIRECTORY": filepath.Join(dir, "mps", d.UUID, strconv.Itoa(k), "pipe")})
		}
	}
	return out
}

func (n *node) setConditions(c *lease.Conditions) {
	n.cond.Store(c)
	n.leases.SetConditions(c)
	n.store.Invalidate()
}

func (n *node) id(g, i int) string { return DeviceID(n.devs[g].UUID, i) }

func (n *node) ids(g int, idx ...int) []string {
	out := make([]string, len(idx))
	for i, u := range idx {
		out[i] = n.id(g, u)
	}
	return out
}

func (n *node) allocate(t *testing.T, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	t.Helper()
	req := &pluginapi.AllocateRequest{}
	for _, c := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: c})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.kubelet.Plugin().Allocate(ctx, req)
}

func TestRegistersAndListsEveryUnit(t *testing.T) {
	n := newNode(t)
	regs := n.kubelet.Registrations()
	if len(regs) != 1 || regs[0].Version != "v1beta1" || regs[0].Endpoint != SocketName || regs[0].ResourceName != "gpulet.io/unit" ||
		!regs[0].GetOptions().GetGetPreferredAllocationAvailable() {
		t.Fatalf("registrations %v", regs)
	}
	if o := n.kubelet.Options(); o == nil || !o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Fatalf("options %v", o)
	}
	devs := n.kubelet.Updates()[0].Devices
	if len(devs) != 32 || kubelettest.Healthy(devs) != 32 {
		t.Fatalf("%d devices, %d healthy; want 32 healthy", len(devs), kubelettest.Healthy(devs))
	}
	if devs[17].ID != n.devs[1].UUID+"-1" || devs[17].Topology.GetNodes()[0].GetID() != 0 {
		t.Fatalf("device 17 is %v", devs[17])
	}
	fi, err := os.Stat(filepath.Join(n.kubelet.Dir, SocketName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("plugin socket: %v %v", fi, err)
	}
}

func TestUnitsTakenOutsideKubernetesTurnUnhealthy(t *testing.T) {
	n := newNode(t)
	seen := len(n.kubelet.Updates())
	l, err := n.leases.Acquire(context.Background(), identity.Peer{Admin: true}, lease.Request{LeaseRequest: api.LeaseRequest{Units: 2}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	up, seen := n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 30 })
	for _, u := range l.Units {
		if h := kubelettest.Health(up.Devices, n.id(l.GPU.Index, u)); h != pluginapi.Unhealthy {
			t.Fatalf("leased unit %d is %s", u, h)
		}
	}
	if err := n.leases.Release(identity.Peer{Admin: true}, l.ID); err != nil {
		t.Fatal(err)
	}
	_, seen = n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 32 })

	// An offline claim, the test's own. Made by another user than pods'
	// (root), it also keeps pods off the rest of its MPS instance.
	c := claim(t, n.ledger.Path(1, 11))
	defer c.Close()
	want := 31
	if os.Getuid() != 0 {
		_, size := n.model.InstanceRange(n.model.InstanceOf(11))
		want = 32 - size
	}
	up, seen = n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == want })
	if h := kubelettest.Health(up.Devices, n.id(1, 11)); h != pluginapi.Unhealthy {
		t.Fatalf("claimed unit is %s", h)
	}

	// A busy GPU, a down instance (the claim's), a draining node.
	n.setConditions(&lease.Conditions{GPUs: []lease.GPUCondition{{Unusable: "is 95% busy"}, {InstanceDown: []string{"", "is down"}}}})
	up, seen = n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 8 })
	if kubelettest.Health(up.Devices, n.id(1, 0)) != pluginapi.Healthy || kubelettest.Health(up.Devices, n.id(1, 8)) != pluginapi.Unhealthy {
		t.Fatal("health does not follow the instances")
	}
	n.setConditions(&lease.Conditions{Draining: true})
	n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 0 })
}

func TestAllocateMakesAPodLease(t *testing.T) {
	n := newNode(t)
	ids := n.ids(1, 9, 10)
	// The kubelet lists the pod that holds the units, as it does once the
	// container runs: else the reconcile would end the lease two intervals
	// on, midway through the checks below on a loaded machine.
	n.kubelet.SetPods(kubelettest.Pod("ns", "train", "main", ResourceName, ids...))
	resp, err := n.allocate(t, ids)
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.ContainerResponses[0]
	leaseID := cr.Envs["GPULET_LEASE_ID"]
	l, err := n.leases.Get(identity.Peer{Admin: true}, leaseID)
	if err != nil {
		t.Fatalf("lease %q of the answer: %v", leaseID, err)
	}
	if l.Binding != "pod" || l.GPU.Index != 1 || !slices.Equal(l.Units, []int{9, 10}) || l.Owner.UID != 0 || !slices.Equal(l.Pod.Devices, ids) {
		t.Fatalf("lease %+v", l)
	}
	for k, v := range l.Env {
		if cr.Envs[k] != v {
			t.Errorf("env %s=%q, the lease says %q", k, cr.Envs[k], v)
		}
	}
	pipe := l.Env["CUDA_MPS_PIPE_DIRECTORY"]
	if cr.Envs["NVIDIA_VISIBLE_DEVICES"] != n.devs[1].UUID || pipe == "" || !strings.Contains(pipe, "/1/") {
		t.Fatalf("env %v", cr.Envs)
	}
	if len(cr.Mounts) != 1 || cr.Mounts[0].HostPath != pipe || cr.Mounts[0].ContainerPath != pipe {
		t.Fatalf("mounts %v", cr.Mounts)
	}
	if !n.ledger.Present(1, 9) || !n.ledger.Present(1, 10) {
		t.Fatal("no pipe files for the pod's units")
	}
	// A pod's units stay healthy: the kubelet counts them as allocated.
	if h := kubelettest.Healthy(n.kubelet.Updates()[len(n.kubelet.Updates())-1].Devices); h != 32 {
		t.Fatalf("%d healthy after an allocation", h)
	}

	for _, c := range []struct {
		name       string
		containers [][]string
		code       codes.Code
		says       string
	}{
		{"spans GPUs", [][]string{{n.id(0, 1), n.id(1, 1)}}, codes.InvalidArgument, "one GPU"},
		{"more than M", [][]string{n.ids(0, 1, 2, 3)}, codes.InvalidArgument, "--units-per-client"},
		{"unknown device", [][]string{{"GPU-nope-1"}}, codes.InvalidArgument, "not one of this node's"},
		{"second container spans instances", [][]string{n.ids(0, 0), n.ids(1, 7, 8)}, codes.InvalidArgument, "one instance"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(n.leases.View().Leases())
			_, err := n.allocate(t, c.containers...)
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v, want %s saying %q", err, c.code, c.says)
			}
			if after := len(n.leases.View().Leases()); after != before {
				t.Fatalf("%d leases after a refused allocation, %d before", after, before)
			}
		})
	}
	// Units a lease outside Kubernetes holds are refused, naming it.
	ttl, err := n.leases.Acquire(context.Background(), identity.Peer{Admin: true}, lease.Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.allocate(t, n.ids(0, ttl.Units[0]))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), ttl.ID) {
		t.Fatalf("allocating a gpurun unit: %v", err)
	}
}

func TestPreferredAllocationIsThePlacementEngines(t *testing.T) {
	n := newNode(t)
	// GPU 1 has one unit taken: best fit goes there, to the fuller
	// instance.
	if _, err := n.allocate(t, n.ids(1, 12)); err != nil {
		t.Fatal(err)
	}
	var available []string
	for g := range 2 {
		for i := range 16 {
			if g != 1 || i != 12 {
				available = append(available, n.id(g, i))
			}
		}
	}
	ctx := context.Background()
	resp, err := n.kubelet.Plugin().GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, AllocationSize: 2},
		{AvailableDeviceIDs: n.ids(0, 0, 1, 2, 3), MustIncludeDeviceIDs: n.ids(0, 3), AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := [][]string{resp.ContainerResponses[0].DeviceIDs, resp.ContainerResponses[1].DeviceIDs}
	if want := [][]string{n.ids(1, 8, 9), n.ids(0, 0, 3)}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("preferred %v, want %v", got, want)
	}
	if len(n.leases.View().Leases()) != 1 {
		t.Fatal("a preference made a lease")
	}
	_, err = n.kubelet.Plugin().GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: n.ids(0, 7, 8), AllocationSize: 2},
	}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "instance") {
		t.Fatalf("two units on two instances: %v", err)
	}
}

func TestMultiContainerAllocationIsAllOrNothing(t *testing.T) {
	n := newNode(t)
	fd := claim(t, n.ledger.Path(0, 5))
	defer fd.Close()
	n.kubelet.Wait("the claim counted", 5*time.Second, func() bool { return n.leases.View().GPUs[0].Offline == 1 })
	_, err := n.allocate(t, n.ids(1, 0, 1), n.ids(0, 5))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "container 1") {
		t.Fatalf("err = %v", err)
	}
	if ls := n.leases.View().Leases(); len(ls) != 0 {
		t.Fatalf("leases left by a refused allocation: %v", ls)
	}
}

func TestPodLeasesFollowPodResources(t *testing.T) {
	// Slow enough that the pod is listed before two Lists miss its lease,
	// as the kubelet lists it at once.
	n := newNodeEvery(t, 200*time.Millisecond)
	resp, err := n.allocate(t, n.ids(0, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerResponses[0].Envs["GPULET_LEASE_ID"]
	n.kubelet.SetPods(kubelettest.Pod("ns", "train", "main", ResourceName, n.ids(0, 1, 2)...))
	testutil.Eventually(t, "the lease named after its pod", func() bool {
		l, err := n.leases.Get(identity.Peer{Admin: true}, id)
		return err == nil && l.Pod.Namespace == "ns" && l.Pod.Name == "train" && l.Pod.Container == "main"
	})
	// A container holding units no lease holds is recorded.
	n.kubelet.SetPods(kubelettest.Pod("ns", "train", "main", ResourceName, n.ids(0, 1, 2)...),
		kubelettest.Pod("ns", "old", "c", ResourceName, n.ids(1, 4)...),
		kubelettest.Pod("ns", "other", "c", "nvidia.com/gpu", "GPU-x"))
	testutil.Eventually(t, "the pod lease rebuilt", func() bool { return len(n.leases.View().Leases()) == 2 })
	var rebuilt api.Lease
	for _, l := range n.leases.View().Leases() {
		if l.ID != id {
			rebuilt = l
		}
	}
	if rebuilt.Binding != "pod" || rebuilt.GPU.Index != 1 || !slices.Equal(rebuilt.Units, []int{4}) || rebuilt.Pod.Name != "old" {
		t.Fatalf("rebuilt %+v", rebuilt)
	}
	// The pod ends: its lease is released within a few intervals.
	lists := n.kubelet.Lists()
	n.kubelet.SetPods(kubelettest.Pod("ns", "old", "c", ResourceName, n.ids(1, 4)...))
	testutil.Eventually(t, "the lease released", func() bool {
		_, err := n.leases.Get(identity.Peer{Admin: true}, id)
		return err != nil
	})
	if got := n.kubelet.Lists() - lists; got < missesToRelease {
		t.Fatalf("released after %d List(s); want %d in a row to miss it", got, missesToRelease)
	}
	if n.ledger.Present(0, 1) || len(n.leases.View().Leases()) != 1 {
		t.Fatal("the released lease left its pipe files or others went too")
	}
}

func TestRegistersAgainWhenTheKubeletRestarts(t *testing.T) {
	n := newNode(t)
	seen := len(n.kubelet.Updates())
	n.kubelet.Restart()
	n.kubelet.Wait("a second registration", 10*time.Second, func() bool { return len(n.kubelet.Registrations()) >= 2 })
	_, seen = n.kubelet.WaitUpdate(seen, 10*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 32 })
	// The new stream is live: a change reaches it.
	if _, err := n.leases.Acquire(context.Background(), identity.Peer{Admin: true}, lease.Request{LeaseRequest: api.LeaseRequest{Units: 1}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	n.kubelet.WaitUpdate(seen, 10*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 31 })
	if _, err := n.allocate(t, n.ids(1, 0)); err != nil {
		t.Fatalf("Allocate after the restart: %v", err)
	}
}

// TestRegistersAgainOnEveryKubeletSocket: a kubelet socket made anew with
// the inode of the one registered with (as ext4 may give it) is a kubelet
// restart all the same: the plugin registers again, and serves on.
func TestRegistersAgainOnEveryKubeletSocket(t *testing.T) {
	n := newNode(t)
	n.kubelet.Wait("the first registration", 10*time.Second, func() bool { return len(n.kubelet.Registrations()) == 1 })
	sock := filepath.Join(n.kubelet.Dir, "kubelet.sock")
	keep := filepath.Join(n.kubelet.Dir, ".kubelet.sock.keep")
	for i := 2; i <= 3; i++ {
		// The same inode, unlinked and linked again at the kubelet's name.
		if err := os.Link(sock, keep); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(sock); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(keep, sock); err != nil {
			t.Fatal(err)
		}
		os.Remove(keep)
		n.kubelet.Wait(fmt.Sprintf("registration %d", i), 10*time.Second, func() bool { return len(n.kubelet.Registrations()) == i })
	}
	if _, err := n.allocate(t, n.ids(1, 0)); err != nil {
		t.Fatalf("Allocate after registering again: %v", err)
	}
}

func TestSecondPluginOnTheSameFolderIsRefused(t *testing.T) {
	n := newNode(t)
	_, err := Start(Config{Dir: n.kubelet.Dir, PodResourcesSocket: n.kubelet.PodResourcesSocket, Interval: time.Second,
		Devices: n.devs, UnitsPerGPU: 16, Leases: n.leases.Pods(), Changed: n.store.Changed, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "another gpuletd") {
		t.Fatalf("second plugin: %v", err)
	}
}

// With no kubelet yet, the plugin says once that it waits for one, and
// registers when the kubelet's socket appears.
func TestWaitsForTheKubeletAndSaysSo(t *testing.T) {
	n := newNode(t)
	dir := t.TempDir()
	var logs testutil.SyncBuffer
	p, err := Start(Config{Dir: dir, PodResourcesSocket: n.kubelet.PodResourcesSocket, Interval: time.Second,
		Devices: n.devs, UnitsPerGPU: 16, Leases: n.leases.Pods(), Changed: n.store.Changed, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const line = "waiting for the kubelet"
	testutil.Eventually(t, "the plugin saying it waits for the kubelet", func() bool { return strings.Contains(logs.String(), line) })
	// Woken by its folder's changes, it does not say so again: not for a
	// file of no interest, nor when it serves its removed socket anew and
	// finds no kubelet still.
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, SocketName)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the plugin's socket served anew", func() bool { _, err := os.Stat(sock); return err == nil })
	// The plugin handles its folder's events one at a time, in order: once
	// it says it saw the kubelet's socket appear, it is done with the
	// events before.
	if err := os.WriteFile(filepath.Join(dir, kubeletSocketName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the plugin seeing the kubelet's socket", func() bool { return strings.Contains(logs.String(), "the kubelet (re)started") })
	if got := strings.Count(logs.String(), line); got != 1 {
		t.Fatalf("the wait logged %d times:\n%s", got, logs.String())
	}
}
