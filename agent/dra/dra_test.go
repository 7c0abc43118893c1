package dra

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
)

func testNode(t *testing.T) Node {
	t.Helper()
	model, err := units.New(16, 1, 2, 16) // 16 units, instances {0-7} {8-15}
	if err != nil {
		t.Fatal(err)
	}
	devs := inventory.NewSim("n", []inventory.Model{inventory.Models[0], inventory.Models[0]}).Devices()
	free := func(from, to int) []int {
		var out []int
		for i := from; i < to; i++ {
			out = append(out, i)
		}
		return out
	}
	v := &lease.View{GPUs: []lease.GPUView{
		{Instances: []lease.InstanceView{{FreeUnits: free(0, 8), Size: 8}, {FreeUnits: free(8, 16), Size: 8}}},
		// GPU 1: units 0-2 held by gpurun, 8-11 by a claim.
		{Instances: []lease.InstanceView{{FreeUnits: free(3, 8), Size: 8}, {FreeUnits: free(12, 16), Size: 8}},
			Leases: []*api.Lease{
				{ID: "l1", Instance: 0, Units: []int{0, 1, 2}},
				{ID: "l2", Instance: 1, Units: []int{8, 9, 10, 11}, Claim: &api.LeaseClaim{UID: "c"}},
			}},
	}}
	return Node{Devices: devs, Model: model, MPS: true, View: v}
}

func deviceNamed(t *testing.T, devs []resourceapi.Device, name string) *resourceapi.Device {
	t.Helper()
	for i := range devs {
		if devs[i].Name == name {
			return &devs[i]
		}
	}
	return nil
}

// The slices offer what Kubernetes may lease: a share per instance less what
// is held outside Kubernetes, a whole GPU only where nothing outside holds a
// unit, and counter sets that keep whole GPUs and shares apart.
func TestResourcesOfferWhatKubernetesMayLease(t *testing.T) {
	n := testNode(t)
	res := Resources("node-a", n)
	pool, ok := res.Pools["node-a"]
	if !ok || len(pool.Slices) != 2 {
		t.Fatalf("pools %+v", res.Pools)
	}
	if cs := pool.Slices[0].SharedCounters; len(cs) != 2 || cs[0].Name != "gpu-0" || counterValue(cs[0].Counters["instances"]) != 2 {
		t.Fatalf("counter sets %+v", cs)
	}
	devs := pool.Slices[1].Devices
	names := []string{}
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if want := []string{"gpu-0-mps-0", "gpu-0-mps-1", "gpu-0", "gpu-1-mps-0", "gpu-1-mps-1"}; !slices.Equal(names, want) {
		t.Fatalf("devices %v, want %v", names, want)
	}
	units := func(name string) int64 {
		c := deviceNamed(t, devs, name).Capacity["units"]
		return c.Value.Value()
	}
	if units("gpu-0-mps-0") != 8 || units("gpu-1-mps-0") != 5 || units("gpu-1-mps-1") != 8 || units("gpu-0") != 16 {
		t.Fatalf("units %d %d %d %d", units("gpu-0-mps-0"), units("gpu-1-mps-0"), units("gpu-1-mps-1"), units("gpu-0"))
	}
	share := deviceNamed(t, devs, "gpu-0-mps-0")
	if !*share.AllowMultipleAllocations || share.Capacity["memory"].RequestPolicy == nil || share.Capacity["units"].RequestPolicy == nil {
		t.Fatalf("share %+v", share)
	}
	if *share.Attributes["kind"].StringValue != KindShare || *share.Attributes["uuid"].StringValue != n.Devices[0].UUID || !*share.Attributes["mps"].BoolValue {
		t.Fatalf("attributes %+v", share.Attributes)
	}
	if c := deviceNamed(t, devs, "gpu-0").ConsumesCounters[0]; c.CounterSet != "gpu-0" || counterValue(c.Counters["instances"]) != 2 {
		t.Fatalf("whole GPU consumes %+v", c)
	}
	// A draining node, or an instance down, offers nothing there.
	n.Conditions = &lease.Conditions{GPUs: []lease.GPUCondition{{InstanceDown: []string{"", "down"}}, {Unusable: "failed"}}}
	devs = Resources("node-a", n).Pools["node-a"].Slices[1].Devices
	names = names[:0]
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if want := []string{"gpu-0-mps-0", "gpu-0"}; !slices.Equal(names, want) {
		t.Fatalf("with conditions: devices %v, want %v", names, want)
	}
}

func TestParseDevice(t *testing.T) {
	for name, want := range map[string][2]int{"gpu-0": {0, -1}, "gpu-12-mps-3": {12, 3}} {
		g, k, err := ParseDevice(name)
		if err != nil || g != want[0] || k != want[1] {
			t.Errorf("%s: %d %d %v", name, g, k, err)
		}
	}
	for _, bad := range []string{"", "gpu-", "gpu--1", "gpu-01", "gpu-1-mps-", "gpu-1-mps-x", "cpu-1", "gpu-1-mps-1-mps-1"} {
		if _, _, err := ParseDevice(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseDevice(f *testing.F) {
	for _, s := range []string{"gpu-0", "gpu-3-mps-1", "gpu-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, k, err := ParseDevice(s)
		if err != nil {
			return
		}
		back := GPUName(g)
		if k >= 0 {
			back = ShareName(g, k)
		}
		if back != s {
			t.Fatalf("%q parsed as %d %d, which names %q", s, g, k, back)
		}
	})
}

// fakeClaims is a lease table that records the shares asked.
type fakeClaims struct {
	granted []lease.ClaimShare
	ended   []string
	refuse  error
}

func (f *fakeClaims) GrantClaim(s lease.ClaimShare) (lease.Grant, bool, error) {
	if f.refuse != nil {
		return lease.Grant{}, false, f.refuse
	}
	f.granted = append(f.granted, s)
	return lease.Grant{Lease: api.Lease{ID: "l-" + s.Claim.Device, GPU: api.LeaseGPU{UUID: "GPU-x"},
		Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_PIPE_DIRECTORY": "/run/gpulet/mps/0"}}}, false, nil
}

func (f *fakeClaims) EndClaim(uid, _ string) int { f.ended = append(f.ended, uid); return 1 }

func claimFor(pod *corev1.Pod) *resourceapi.ResourceClaim {
	share := types.UID("share-1")
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: DriverName, Pool: "node-a", Device: "gpu-1-mps-0", ShareID: &share,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"units": resource.MustParse("10"), "memory": resource.MustParse("1Gi")},
			}, {
				Request: "other", Driver: "other.example.com", Pool: "node-a", Device: "x",
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
		},
	}
}

func podAs(uid int64, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-uid"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To(uid), RunAsGroup: ptr.To(uid)},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c1")}},
			Containers:      containers,
		},
	}
}

func usingGPU(name string, uid *int64) corev1.Container {
	c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}
	if uid != nil {
		c.SecurityContext = &corev1.SecurityContext{RunAsUser: uid}
	}
	return c
}

// Prepare leases exactly the allocated device and units, as the pod's user,
// writes a CDI spec with the lease's environment, and unprepare ends it.
func TestPrepareLeasesTheAllocationAndWritesItsCDISpec(t *testing.T) {
	pod := podAs(1000, usingGPU("main", nil), corev1.Container{Name: "sidecar"})
	claims := &fakeClaims{}
	dir := t.TempDir()
	d := &Driver{cfg: Config{NodeName: "node-a", CDIDir: dir, Claims: claims, Logger: quiet()}, client: fake.NewClientset(pod)}
	out, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claimFor(pod)})
	if err != nil || out["uid-1"].Err != nil {
		t.Fatalf("prepare: %v %v", err, out["uid-1"].Err)
	}
	if len(claims.granted) != 1 {
		t.Fatalf("granted %+v", claims.granted)
	}
	s := claims.granted[0]
	if s.GPU != 1 || s.Instance != 0 || s.Units != 10 || s.MemoryMiB != 1024 || s.UID != 1000 || s.Claim.Share != "share-1" || s.Claim.Pod != "ns/p" {
		t.Fatalf("share %+v", s)
	}
	devs := out["uid-1"].Devices
	if len(devs) != 1 || devs[0].DeviceName != "gpu-1-mps-0" || devs[0].CDIDeviceIDs[0] != CDIKind+"=uid-1-gpu-1-mps-0-share-1" {
		t.Fatalf("devices %+v", devs)
	}
	b, err := os.ReadFile(filepath.Join(dir, DriverName+"-uid-1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdiSpec
	if err := json.Unmarshal(b, &spec); err != nil || spec.Kind != CDIKind || len(spec.Devices) != 1 {
		t.Fatalf("spec %s: %v", b, err)
	}
	e := spec.Devices[0].Edits
	if !slices.Contains(e.Env, "GPULET_LEASE_ID=l-gpu-1-mps-0") || !slices.Contains(e.Env, "NVIDIA_VISIBLE_DEVICES=GPU-x") || len(e.Mounts) != 1 || e.Mounts[0].HostPath != "/run/gpulet/mps/0" {
		t.Fatalf("edits %+v", e)
	}
	un, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "c1"}, UID: "uid-1"}})
	if err != nil || un["uid-1"] != nil || !slices.Equal(claims.ended, []string{"uid-1"}) {
		t.Fatalf("unprepare: %v %v %v", err, un, claims.ended)
	}
	if _, err := os.Stat(filepath.Join(dir, DriverName+"-uid-1.json")); !os.IsNotExist(err) {
		t.Fatalf("the CDI spec is still there: %v", err)
	}
	// Twice is no error.
	if un, _ := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-1"}}); un["uid-1"] != nil {
		t.Fatal(un["uid-1"])
	}
}

// A claim the table refuses, or whose pod's containers run as two users,
// fails with the reason and leaves no lease and no spec.
func TestPrepareRefusals(t *testing.T) {
	dir := t.TempDir()
	pod := podAs(1000, usingGPU("a", nil), usingGPU("b", ptr.To(int64(2000))))
	claims := &fakeClaims{}
	d := &Driver{cfg: Config{NodeName: "node-a", CDIDir: dir, Claims: claims, Logger: quiet()}, client: fake.NewClientset(pod)}
	out, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claimFor(pod)})
	if err := out["uid-1"].Err; err == nil || !strings.Contains(err.Error(), "one user") {
		t.Fatalf("two users: %v", err)
	}
	pod = podAs(1000, usingGPU("a", nil))
	claims.refuse = errors.New("unit 3 of GPU 1 is claimed offline")
	d.client = fake.NewClientset(pod)
	out, _ = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claimFor(pod)})
	if err := out["uid-1"].Err; err == nil || !strings.Contains(err.Error(), "claimed offline") || !strings.Contains(err.Error(), "ns/c1") {
		t.Fatalf("refused: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 || len(claims.granted) != 0 {
		t.Fatalf("left %v, granted %v", entries, claims.granted)
	}
	// A pod that is not the one the claim is reserved for.
	other := podAs(1000, usingGPU("a", nil))
	other.UID = "another"
	claims.refuse = nil
	d.client = fake.NewClientset(other)
	out, _ = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claimFor(pod)})
	if err := out["uid-1"].Err; err == nil || !strings.Contains(err.Error(), "not the one") {
		t.Fatalf("replaced pod: %v", err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func counterValue(c resourceapi.Counter) int64 { return c.Value.Value() }
