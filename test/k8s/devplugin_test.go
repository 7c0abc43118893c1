package k8s

import (
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// TestDevicePluginPodRunsWithItsLease: a pod that asks for 4 units of
// gpulet.io/unit runs with the environment of the lease gpuletd made for
// it, as the real kubelet passed it on; the lease ends when the pod is
// deleted.
func TestDevicePluginPodRunsWithItsLease(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 2*time.Minute)
	if err := c.Apply(unitPod("units4", 4)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePods(t, c, g, "units4") })
	if _, err := c.WaitPod(ctx, "default", "units4", kcluster.Running, time.Minute); err != nil {
		t.Fatal(err)
	}
	log := waitLog(t, c, "default", "units4", "probe ready")
	l := waitPodLease(t, g, "default", "units4", true, 20*time.Second)
	if len(l.Units) != 4 || l.Owner.UID != 0 {
		t.Errorf("lease %s: units %v, owner uid %d; want 4 units, uid 0 (the kubelet's)", l.ID, l.Units, l.Owner.UID)
	}
	want := map[string]string{"GPULET_LEASE_ID": l.ID, "NVIDIA_VISIBLE_DEVICES": l.GPU.UUID}
	for k, v := range l.Env {
		want[k] = v
	}
	// 4 of a GPU's 16 units are a quarter of its threads
	if l.Env["CUDA_VISIBLE_DEVICES"] == "" || l.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" {
		t.Errorf("lease env %v: want CUDA_VISIBLE_DEVICES and a thread percentage of 25", l.Env)
	}
	got := probeEnv(log)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the container's %s is %q, the lease's %q", k, got[k], v)
		}
	}
	if t.Failed() {
		t.Logf("the probe's log:\n%s", log)
	}

	t0 := time.Now()
	if _, err := c.Kubectl("delete", "pod", "-n", "default", "units4", "--wait=true"); err != nil {
		t.Fatal(err)
	}
	waitPodLease(t, g, "default", "units4", false, 30*time.Second)
	t.Logf("the pod's lease ended %.1fs after its deletion was complete", time.Since(t0).Seconds())
}

// TestDevicePluginLeaseSurvivesKubeletRestart: a kubelet restart keeps a
// running pod's lease (and the pod).
func TestDevicePluginLeaseSurvivesKubeletRestart(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 3*time.Minute)
	if err := c.Apply(unitPod("survivor", 4)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePods(t, c, g, "survivor") })
	if _, err := c.WaitPod(ctx, "default", "survivor", kcluster.Running, time.Minute); err != nil {
		t.Fatal(err)
	}
	before := waitPodLease(t, g, "default", "survivor", true, 20*time.Second)
	if err := c.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	// gpuletd registers again when the kubelet makes its socket anew...
	if err := waitAllocatable(ctx, c, unitsPerNode); err != nil {
		t.Fatal(err)
	}
	// ...and does not count pod-resources Lists of the first two intervals
	// after; past four (500ms each), a lost lease would be gone.
	time.Sleep(3 * time.Second)
	after := podLease(t, g, "default", "survivor")
	if after == nil || after.ID != before.ID {
		t.Fatalf("after the kubelet's restart the pod's lease is %+v, was %s", after, before.ID)
	}
	restarts, err := c.Kubectl("get", "pod", "-n", "default", "survivor", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount}")
	if err != nil || strings.TrimSpace(restarts) != "Running 0" {
		t.Errorf("after the kubelet's restart the pod is %q (%v), want Running with no container restart", restarts, err)
	}
}

// probeEnv is the environment a probe printed, "env NAME=VALUE" lines.
func probeEnv(log string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(log, "\n") {
		if kv, ok := strings.CutPrefix(line, "env "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	return env
}

// TestDevicePluginThreePodsOfTenUnits holds what the device plugin does
// with three pods of 10 units on a node of two 16-unit GPUs, the limit of
// its model: the first two run, one on each GPU; the scheduler counts
// 32 - 20 = 12 units free on the node and binds the third to it too,
// though no GPU has 10 units left; the kubelet then rejects it at
// admission (gpuletd refuses its preferred allocation) and the pod ends
// Failed for good: freeing a GPU afterwards does not bring it back.
func TestDevicePluginThreePodsOfTenUnits(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 3*time.Minute)
	pods := []string{"ten-a", "ten-b", "ten-c"}
	t.Cleanup(func() { deletePods(t, c, g, pods...) })
	gpus := map[string]bool{}
	for _, p := range pods[:2] {
		if err := c.Apply(unitPod(p, 10)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitPod(ctx, "default", p, kcluster.Running, time.Minute); err != nil {
			t.Fatal(err)
		}
		gpus[waitPodLease(t, g, "default", p, true, 20*time.Second).GPU.UUID] = true
	}
	if len(gpus) != 2 {
		t.Errorf("the two 10-unit pods' leases are on GPUs %v, want one each", gpus)
	}
	if err := c.Apply(unitPod(pods[2], 10)); err != nil {
		t.Fatal(err)
	}
	p, err := c.WaitPod(ctx, "default", pods[2], kcluster.Failed, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != c.NodeName || p.Status.Reason != "UnexpectedAdmissionError" ||
		!strings.Contains(p.Status.Message, "no GPU can take 10 unit(s) now") {
		t.Fatalf("the third pod: node %q, %s: %s; want bound to %s, then rejected at admission for want of a GPU with 10 units",
			p.Spec.NodeName, p.Status.Reason, p.Status.Message, c.NodeName)
	}
	t.Logf("the third pod: scheduled to %s, then %s: %s", p.Spec.NodeName, p.Status.Reason, p.Status.Message)

	deletePods(t, c, g, pods[0])
	time.Sleep(3 * time.Second)
	if p, err := c.GetPod("default", pods[2]); err != nil || p == nil || p.Status.Phase != "Failed" {
		t.Errorf("with a GPU free again the third pod is %+v (%v), want still Failed: nothing retries a rejected pod", p, err)
	}
	if l := podLease(t, g, "default", pods[2]); l != nil {
		t.Errorf("the rejected pod has lease %s", l.ID)
	}
}
