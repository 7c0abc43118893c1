package test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
	"github.com/gpulet/gpulet/test/kubelettest"
)

const unitResource = "gpulet.io/unit"

// startKubeletPlugin starts a test kubelet and the real gpuletd as its
// device plugin (two simulated A100s of 16 units, M=2), and waits for the
// first device list.
func startKubeletPlugin(t *testing.T, extra ...string) (*kubelettest.Kubelet, *e2e.Daemon) {
	t.Helper()
	k := kubelettest.Start(t)
	args := append([]string{"--kubelet-plugin", "--kubelet-dir", k.Dir, "--pod-resources-socket", k.PodResourcesSocket,
		"--pod-resources-interval", "100ms", "--units-per-client", "2", "--units-per-gpu", "16"}, extra...)
	d := e2e.Start(t, args...)
	k.Wait("gpuletd's registration and device list", 20*time.Second, func() bool { return len(k.Updates()) > 0 })
	return k, d
}

func allocate(t *testing.T, k *kubelettest.Kubelet, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := k.Plugin().Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

func deviceID(uuid string, i int) string { return uuid + "-" + strconv.Itoa(i) }

// TestKubeletPlugin drives the real gpuletd with a kubelet built from the
// kubelet's own API packages: registration, a gpurun lease turning units
// unhealthy in ListAndWatch, preferred allocation, Allocate's lease and env,
// release when the pod leaves pod-resources, and registering again after
// the kubelet restarts.
func TestKubeletPlugin(t *testing.T) {
	k, d := startKubeletPlugin(t)
	regs := k.Registrations()
	if len(regs) != 1 || regs[0].ResourceName != unitResource || regs[0].Endpoint != "gpulet.sock" || regs[0].Version != pluginapi.Version {
		t.Fatalf("registrations %v", regs)
	}
	snap, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	gpu0, gpu1 := snap.GPUs[0].UUID, snap.GPUs[1].UUID
	first := k.Updates()[0].Devices
	if len(first) != 32 || kubelettest.Healthy(first) != 32 || first[0].ID != deviceID(gpu0, 0) {
		t.Fatalf("first device list: %d devices, %d healthy, first %v", len(first), kubelettest.Healthy(first), first[0])
	}

	// A gpurun lease takes two units of GPU 0: they turn unhealthy.
	seen := len(k.Updates())
	run := exec.Command(e2e.Bin("gpurun"), "--units", "2", "--gpu", "0", "--", "sleep", "300")
	run.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer run.Process.Kill()
	up, _ := k.WaitUpdate(seen, 10*time.Second, func(devs []*pluginapi.Device) bool { return kubelettest.Healthy(devs) == 30 })
	ls, err := d.Client.Leases(e2e.Ctx(t))
	if err != nil || len(ls) != 1 || ls[0].Binding != "pid" {
		t.Fatalf("leases %v, %v", ls, err)
	}
	for _, u := range ls[0].Units {
		if h := kubelettest.Health(up.Devices, deviceID(gpu0, u)); h != pluginapi.Unhealthy {
			t.Fatalf("unit %d of the gpurun lease is %s", u, h)
		}
	}

	// The placement engine's choice among what the kubelet offers: best fit
	// goes to GPU 0, fuller now.
	var available []string
	for _, dev := range up.Devices {
		if dev.Health == pluginapi.Healthy {
			available = append(available, dev.ID)
		}
	}
	pref, err := k.Plugin().GetPreferredAllocation(e2e.Ctx(t), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	chosen := pref.ContainerResponses[0].DeviceIDs
	if len(chosen) != 2 || !strings.HasPrefix(chosen[0], gpu0) || !strings.HasPrefix(chosen[1], gpu0) {
		t.Fatalf("preferred %v; want two units of GPU 0 (%s)", chosen, gpu0)
	}

	// Allocate: a pod lease of exactly those units, its env, no mount with
	// MPS off.
	cr, err := allocate(t, k, chosen...)
	if err != nil {
		t.Fatal(err)
	}
	podLease, err := d.Client.GetLease(e2e.Ctx(t), cr.Envs["GPULET_LEASE_ID"])
	if err != nil {
		t.Fatalf("the allocation's lease: %v (env %v)", err, cr.Envs)
	}
	if podLease.Binding != "pod" || podLease.Owner.UID != 0 || !slices.Equal(podLease.Pod.Devices, chosen) {
		t.Fatalf("pod lease %+v", podLease)
	}
	for key, v := range podLease.Env {
		if cr.Envs[key] != v {
			t.Fatalf("env %s=%q; the lease says %q", key, cr.Envs[key], v)
		}
	}
	if cr.Envs["CUDA_VISIBLE_DEVICES"] != gpu0 || cr.Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" || len(cr.Mounts) != 0 {
		t.Fatalf("env %v, mounts %v", cr.Envs, cr.Mounts)
	}
	if n := e2e.CountFIFOs(t, d.RunDir, gpu0); n != 4 {
		t.Fatalf("%d pipe files on GPU 0; want 4 (gpurun's 2 and the pod's 2)", n)
	}
	// Refusals: units on two GPUs, more than M, units gpurun holds.
	for _, c := range []struct {
		ids  []string
		code codes.Code
		says string
	}{
		{[]string{deviceID(gpu0, 10), deviceID(gpu1, 10)}, codes.InvalidArgument, "one GPU"},
		{[]string{deviceID(gpu1, 0), deviceID(gpu1, 1), deviceID(gpu1, 2)}, codes.InvalidArgument, "--units-per-client"},
		{[]string{deviceID(gpu0, ls[0].Units[0])}, codes.ResourceExhausted, ls[0].ID},
	} {
		if _, err := allocate(t, k, c.ids...); status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("allocating %v: %v; want %s naming %q", c.ids, err, c.code, c.says)
		}
	}

	// The kubelet lists the pod: the lease is named after it.
	k.SetPods(kubelettest.Pod("ml", "train-0", "main", unitResource, chosen...))
	testutil.Eventually(t, "the lease named after its pod", func() bool {
		out, code := gpulet(t, d, "leases", "--all")
		return code == 0 && strings.Contains(out, "pod ml/train-0") && strings.Contains(out, "when pod ends")
	})

	// The kubelet restarts: gpuletd registers again and serves the new
	// kubelet, which still sees the units as they are.
	seen = len(k.Updates())
	k.Restart()
	k.Wait("a second registration", 20*time.Second, func() bool { return len(k.Registrations()) >= 2 })
	k.WaitUpdate(seen, 10*time.Second, func(devs []*pluginapi.Device) bool { return len(devs) == 32 && kubelettest.Healthy(devs) == 30 })

	// The pod goes: its lease ends, well within 30 seconds.
	gone := time.Now()
	k.SetPods()
	testutil.Eventually(t, "the pod's lease released", func() bool {
		_, err := d.Client.GetLease(e2e.Ctx(t), podLease.ID)
		return errors.Is(err, client.ErrNotFound)
	})
	if took := time.Since(gone); took > 30*time.Second {
		t.Fatalf("released %s after the pod left", took)
	}
	if n := e2e.CountFIFOs(t, d.RunDir, gpu0); n != 2 {
		t.Fatalf("%d pipe files on GPU 0 after the release; want gpurun's 2", n)
	}

	// gpurun's command ends: its units are healthy again.
	run.Process.Kill()
	run.Wait()
	k.WaitUpdate(0, 10*time.Second, func(devs []*pluginapi.Device) bool {
		return kubelettest.Health(devs, deviceID(gpu0, ls[0].Units[0])) == pluginapi.Healthy && kubelettest.Healthy(devs) == 32
	})
}

// TestKubeletPodLeasesOutliveADaemonRestart: a pod lease is journaled and
// kept across a gpuletd restart; when the journal is lost, the lease is
// rebuilt from what pod-resources lists.
func TestKubeletPodLeasesOutliveADaemonRestart(t *testing.T) {
	k, d := startKubeletPlugin(t)
	snap, _ := d.Client.Snapshot(e2e.Ctx(t))
	ids := []string{deviceID(snap.GPUs[1].UUID, 4), deviceID(snap.GPUs[1].UUID, 5)}
	cr, err := allocate(t, k, ids...)
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Envs["GPULET_LEASE_ID"]
	k.SetPods(kubelettest.Pod("ns", "p", "c", unitResource, ids...))
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	l, err := d.Client.GetLease(e2e.Ctx(t), id)
	if err != nil || l.Binding != "pod" || !slices.Equal(l.Units, []int{4, 5}) {
		t.Fatalf("after a restart: %+v, %v", l, err)
	}

	// The run dir loses the journal (a reboot would lose it all): the
	// lease comes back from pod-resources, under a new id.
	d.Stop()
	if err := os.Remove(filepath.Join(d.RunDir, "leases.journal")); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	var rebuilt api.Lease
	testutil.Eventually(t, "the pod lease rebuilt from pod-resources", func() bool {
		ls, err := d.Client.Leases(e2e.Ctx(t))
		if err != nil || len(ls) != 1 {
			return false
		}
		rebuilt = ls[0]
		return true
	})
	if rebuilt.Binding != "pod" || rebuilt.GPU.Index != 1 || !slices.Equal(rebuilt.Units, []int{4, 5}) || rebuilt.Pod.Name != "p" {
		t.Fatalf("rebuilt %+v", rebuilt)
	}
	// gpuletd writes info lines in batches (internal/logwriter), so the line
	// may follow the lease it tells of.
	testutil.Eventually(t, "the log says the lease was rebuilt", func() bool {
		return strings.Contains(d.Log.String(), "pod lease rebuilt from the kubelet's pod-resources API")
	})
}

// TestKubeletAllocateMountsTheMPSPipeFolder: with MPS on, a container gets
// its instance's pipe folder mounted where its env says.
func TestKubeletAllocateMountsTheMPSPipeFolder(t *testing.T) {
	k := kubelettest.Start(t)
	d, _ := startMPSDaemon(t, "--kubelet-plugin", "--kubelet-dir", k.Dir, "--pod-resources-socket", k.PodResourcesSocket,
		"--units-per-client", "2", "--instances-per-gpu", "2", "--units-per-gpu", "16")
	k.Wait("gpuletd's device list", 20*time.Second, func() bool { return len(k.Updates()) > 0 })
	snap, _ := d.Client.Snapshot(e2e.Ctx(t))
	cr, err := allocate(t, k, deviceID(snap.GPUs[0].UUID, 9), deviceID(snap.GPUs[0].UUID, 10))
	if err != nil {
		t.Fatal(err)
	}
	pipe := cr.Envs["CUDA_MPS_PIPE_DIRECTORY"]
	if !strings.Contains(pipe, snap.GPUs[0].UUID+"/1") {
		t.Fatalf("pipe folder %q is not instance 1's of GPU 0", pipe)
	}
	if len(cr.Mounts) != 1 || cr.Mounts[0].HostPath != pipe || cr.Mounts[0].ContainerPath != pipe {
		t.Fatalf("mounts %v; want %s at the same path", cr.Mounts, pipe)
	}
	if fi, err := os.Stat(pipe); err != nil || !fi.IsDir() {
		t.Fatalf("the mounted folder: %v", err)
	}
	if cr.Envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "" || cr.Envs["CUDA_MPS_LOG_DIRECTORY"] == "" {
		t.Fatalf("env %v lacks MPS variables", cr.Envs)
	}
}
