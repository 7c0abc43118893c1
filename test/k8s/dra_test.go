package k8s

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// claimTemplate is a ResourceClaimTemplate of units of one share of the
// DeviceClass units.gpulet.io; with user set, it asks for an instance that
// serves no one or that user (docs/kubernetes.md, "One user per MPS server").
func claimTemplate(name string, units int, user string) string {
	sel := ""
	if user != "" {
		sel = fmt.Sprintf(`
          selectors:
          - cel:
              expression: 'device.attributes["gpu.gpulet.io"].user in ["", "%s"]'`, user)
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %s, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: units.gpulet.io
          capacity:
            requests: {units: "%d"}%s
`, name, units, sel)
}

// claimPod is a probe pod running as uid that takes a claim of template.
func claimPod(name, template string, uid int) string {
	return probePodWith(name,
		fmt.Sprintf("  securityContext: {runAsUser: %d, runAsGroup: %d}\n  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: %s}\n", uid, uid, template),
		"    resources:\n      claims:\n      - {name: gpu}\n")
}

// claimLease is the claim lease gpuletd made for a pod's claim, or nil.
func claimLease(t *testing.T, g *client.Client, ns, pod string) *api.Lease {
	t.Helper()
	if l := podLease(t, g, ns, pod); l != nil && l.Claim != nil {
		return l
	}
	return nil
}

// slices is the node's ResourceSlices of gpulet's driver, as devices by name.
func sliceDevices(t *testing.T, c *kcluster.Cluster) map[string]map[string]any {
	t.Helper()
	out, err := c.Kubectl("get", "resourceslices", "-o", "json", "--field-selector", "spec.driver=gpu.gpulet.io")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []struct {
			Spec struct {
				Devices []map[string]any `json:"devices"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	devs := map[string]map[string]any{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			devs[fmt.Sprint(d["name"])] = d
		}
	}
	return devs
}

// waitSlices waits until the node's slices hold exactly the named devices.
func waitSlices(t *testing.T, c *kcluster.Cluster, want ...string) map[string]map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		devs := sliceDevices(t, c)
		ok := len(devs) == len(want)
		for _, w := range want {
			ok = ok && devs[w] != nil
		}
		if ok {
			return devs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's ResourceSlices hold %d devices, want %v", len(devs), want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDRAClaimsSeeEachGPU: on a node of two 16-unit GPUs, three pods that
// each claim 10 units: two run, on different GPUs, each with its lease's
// environment; the scheduler keeps the third Pending, saying why, and it is
// never admitted; once one is deleted, it runs.
func TestDRAClaimsSeeEachGPU(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 4*time.Minute)
	waitSlices(t, c, "gpu-0", "gpu-1", "gpu-0-mps-0", "gpu-1-mps-0")
	if err := c.Apply(claimTemplate("units10", 10, "")); err != nil {
		t.Fatal(err)
	}
	pods := []string{"dra-a", "dra-b", "dra-c"}
	t.Cleanup(func() { deletePods(t, c, g, pods...) })
	for _, p := range pods[:2] {
		if err := c.Apply(claimPod(p, "units10", 1000)); err != nil {
			t.Fatal(err)
		}
	}
	gpus := map[string]string{}
	for _, p := range pods[:2] {
		if _, err := c.WaitPod(ctx, "default", p, kcluster.Running, time.Minute); err != nil {
			t.Fatal(err)
		}
		l := claimLease(t, g, "default", p)
		if l == nil || len(l.Units) != 10 || l.Owner.UID != 1000 {
			t.Fatalf("pod %s's claim lease: %+v", p, l)
		}
		gpus[p] = l.GPU.UUID
		env := probeEnv(waitLog(t, c, "default", p, "probe ready"))
		for k, v := range map[string]string{"GPULET_LEASE_ID": l.ID, "CUDA_VISIBLE_DEVICES": l.GPU.UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": l.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]} {
			if env[k] != v {
				t.Errorf("pod %s: the container's %s is %q, its lease's %q", p, k, env[k], v)
			}
		}
	}
	if gpus["dra-a"] == gpus["dra-b"] {
		t.Fatalf("both 10-unit claims are on GPU %s", gpus["dra-a"])
	}
	if err := c.Apply(claimPod("dra-c", "units10", 1000)); err != nil {
		t.Fatal(err)
	}
	p, err := c.WaitPod(ctx, "default", "dra-c", kcluster.Unschedulable, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the third pod: %s", scheduledMessage(p))
	// It stays so: never bound to the node, never prepared.
	time.Sleep(3 * time.Second)
	if p, _ := c.GetPod("default", "dra-c"); p == nil || p.Spec.NodeName != "" || claimLease(t, g, "default", "dra-c") != nil {
		t.Fatalf("the third pod was admitted: %+v", p)
	}
	if _, err := c.Kubectl("delete", "pod", "-n", "default", "dra-a", "--wait=true"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.WaitPod(ctx, "default", "dra-c", kcluster.Running, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("the third pod ran %.1fs after the first was deleted", time.Since(t0).Seconds())
	if l := claimLease(t, g, "default", "dra-c"); l == nil || l.GPU.UUID != gpus["dra-a"] {
		t.Fatalf("the third pod's lease %+v, want on the first pod's GPU %s", l, gpus["dra-a"])
	}
}

func scheduledMessage(p *kcluster.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == "PodScheduled" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// TestDRAUnitsLeasedOutsideShrinkTheSlices: units a gpurun user leases on
// the node leave the slices' capacity within a second, and come back.
func TestDRAUnitsLeasedOutsideShrinkTheSlices(t *testing.T) {
	c, g := gpuletd(t)
	waitSlices(t, c, "gpu-0", "gpu-1", "gpu-0-mps-0", "gpu-1-mps-0")
	ctx := testCtx(t, time.Minute)
	l, err := g.Lease(ctx, api.LeaseRequest{Units: 3, GPU: "1", TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for {
		devs := sliceDevices(t, c)
		if devs["gpu-1"] == nil && capacityUnits(devs["gpu-1-mps-0"]) == "13" {
			break
		}
		if time.Since(t0) > 5*time.Second {
			logs, _ := c.Kubectl("logs", "-n", "gpulet-system", "-l", "app.kubernetes.io/name=gpuletd", "--tail=40")
			t.Fatalf("5s after a lease of 3 units of GPU 1 the slices show %v\ngpuletd's log:\n%s", devs["gpu-1-mps-0"], logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the slices shrank %.0f ms after the lease", time.Since(t0).Seconds()*1000)
	if err := g.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	waitSlices(t, c, "gpu-0", "gpu-1", "gpu-0-mps-0", "gpu-1-mps-0")
}

func capacityUnits(dev map[string]any) string {
	capacity, _ := dev["capacity"].(map[string]any)
	units, _ := capacity["units"].(map[string]any)
	return fmt.Sprint(units["value"])
}

// TestDRATwoUsersNeverShareAnInstance: with MPS, pods of two users whose
// claims ask for a free instance or their own are placed on different
// instances; a third user finds none and waits.
func TestDRATwoUsersNeverShareAnInstance(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 3*time.Minute)
	for _, u := range []string{"1000", "2000", "3000"} {
		if err := c.Apply(claimTemplate("units2-"+u, 2, u)); err != nil {
			t.Fatal(err)
		}
	}
	pods := []string{"user-1000", "user-2000", "user-1000-b", "user-3000"}
	t.Cleanup(func() { deletePods(t, c, g, pods...) })
	instanceOf := map[string]string{}
	for _, p := range pods[:3] {
		u := strings.TrimSuffix(strings.TrimPrefix(p, "user-"), "-b")
		if err := c.Apply(claimPod(p, "units2-"+u, atoi(u))); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitPod(ctx, "default", p, kcluster.Running, time.Minute); err != nil {
			t.Fatal(err)
		}
		l := claimLease(t, g, "default", p)
		if l == nil {
			t.Fatalf("pod %s runs without a claim lease", p)
		}
		instanceOf[p] = l.Claim.Device
	}
	if instanceOf["user-1000"] == instanceOf["user-2000"] {
		t.Fatalf("users 1000 and 2000 share instance %s", instanceOf["user-1000"])
	}
	if instanceOf["user-1000-b"] != instanceOf["user-1000"] {
		t.Errorf("user 1000's second pod went to %s, not beside its first on %s", instanceOf["user-1000-b"], instanceOf["user-1000"])
	}
	// Both instances serve a user: a third user's pod waits.
	if err := c.Apply(claimPod("user-3000", "units2-3000", 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPod(ctx, "default", "user-3000", kcluster.Unschedulable, time.Minute); err != nil {
		t.Fatal(err)
	}
}

func atoi(s string) int {
	n := 0
	fmt.Sscan(s, &n)
	return n
}

// setSimGPUs changes the DaemonSet's --sim-gpus and waits for the new
// gpuletd to serve with that many units.
func setSimGPUs(t *testing.T, c *kcluster.Cluster, gpus string, units int) {
	t.Helper()
	out, err := c.Kubectl("get", "ds", "-n", "gpulet-system", "gpuletd", "-o", "jsonpath={.spec.template.spec.containers[0].args}")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	if err := json.Unmarshal([]byte(out), &args); err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		if strings.HasPrefix(a, "--sim-gpus=") {
			args[i] = "--sim-gpus=" + gpus
		}
	}
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}})
	if _, err := c.Kubectl("patch", "ds", "-n", "gpulet-system", "gpuletd", "--type=json", "-p", string(patch)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl("rollout", "status", "ds/gpuletd", "-n", "gpulet-system", "--timeout=90s"); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	if err := waitAllocatable(ctx, c, units); err != nil {
		t.Fatal(err)
	}
	if err := waitDRARegistered(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// gpuletdPid is the host pid of the DaemonSet's gpuletd.
func gpuletdPid(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", "-n", "^/usr/local/bin/gpuletd ").Output()
	if err != nil {
		t.Fatalf("no gpuletd process: %v", err)
	}
	return atoi(strings.TrimSpace(string(out)))
}

// TestDRAFiftyPodsAndAKill9: 50 pods with claims created at once on a node of
// four GPUs, gpuletd killed with SIGKILL while they start: every pod runs,
// no unit is leased twice, each running pod's environment is its lease's,
// and the leases made before the kill are the same after it.
func TestDRAFiftyPodsAndAKill9(t *testing.T) {
	c, g := gpuletd(t)
	setSimGPUs(t, c, "4xH100-80GB", 64)
	t.Cleanup(func() { setSimGPUs(t, c, "2xH100-80GB", unitsPerNode) })
	if err := c.Apply(claimTemplate("units1", 1, "")); err != nil {
		t.Fatal(err)
	}
	const n = 50
	var pods []string
	var all strings.Builder
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("many-%02d", i)
		pods = append(pods, name)
		all.WriteString(claimPod(name, "units1", 1000))
		all.WriteString("---\n")
	}
	t.Cleanup(func() { deletePods(t, c, g, pods...) })
	t0 := time.Now()
	if err := c.Apply(all.String()); err != nil {
		t.Fatal(err)
	}
	// Kill gpuletd once some claims are prepared and others are not.
	before := map[string]string{}
	for len(before) < 10 {
		if time.Since(t0) > 2*time.Minute {
			t.Fatalf("after 2 minutes only %d claims are prepared", len(before))
		}
		leases, err := g.LeasesAll(testCtx(t, 10*time.Second))
		if err == nil {
			for _, l := range leases {
				if l.Claim != nil {
					before[l.Claim.Pod] = l.ID
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := gpuletdPid(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed gpuletd (pid %d) with %d claims prepared, %.1fs after the pods were created", pid, len(before), time.Since(t0).Seconds())
	ctx := testCtx(t, 5*time.Minute)
	for _, p := range pods {
		if _, err := c.WaitPod(ctx, "default", p, kcluster.Running, 4*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("all %d pods ran %.1fs after they were created", n, time.Since(t0).Seconds())
	leases, err := g.LeasesAll(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	byPod := map[string]api.Lease{}
	for _, l := range leases {
		if l.Claim == nil {
			continue
		}
		byPod[l.Claim.Pod] = l
		for _, u := range l.Units {
			key := fmt.Sprintf("%s/%d", l.GPU.UUID, u)
			if other, ok := held[key]; ok {
				t.Errorf("unit %s is leased to %s and %s", key, other, l.Claim.Pod)
			}
			held[key] = l.Claim.Pod
		}
	}
	for _, p := range pods {
		l, ok := byPod["default/"+p]
		if !ok {
			t.Errorf("pod %s runs without a claim lease", p)
			continue
		}
		if id, ok := before["default/"+p]; ok && id != l.ID {
			t.Errorf("pod %s's lease was %s before the kill, %s after", p, id, l.ID)
		}
		env := probeEnv(waitLog(t, c, "default", p, "probe ready"))
		if env["GPULET_LEASE_ID"] != l.ID || env["CUDA_VISIBLE_DEVICES"] != l.GPU.UUID {
			t.Errorf("pod %s runs with lease %s on %s, its lease is %s on %s", p, env["GPULET_LEASE_ID"], env["CUDA_VISIBLE_DEVICES"], l.ID, l.GPU.UUID)
		}
	}
}
