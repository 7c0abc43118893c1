package k8s

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// gpuletdSocket is the DaemonSet's gpuletd's socket as the host sees it:
// the overlay mounts kcluster.RunDir/gpulet at the pod's /run/gpulet.
const gpuletdSocket = kcluster.RunDir + "/gpulet/gpulet.sock"

// overlay is the test's kustomization over deploy/kubernetes.
const overlay = "overlay"

// unitsPerNode is what the overlay's gpuletd offers: two GPUs of 16 units.
const unitsPerNode = 32

var (
	deployOnce sync.Once
	deployErr  error
)

// gpuletd deploys gpuletd as a cluster admin does, once for the package:
// the node labelled as a GPU node, deploy/kubernetes applied (through the
// test overlay) with kubectl apply -k; it waits until gpuletd's pod runs
// and its device plugin has given the node its units, and returns a client
// of its socket.
func gpuletd(t testing.TB) (*kcluster.Cluster, *client.Client) {
	t.Helper()
	c := need(t)
	deployOnce.Do(func() { deployErr = deploy(c) })
	if deployErr != nil {
		t.Fatal(deployErr)
	}
	return c, &client.Client{Socket: gpuletdSocket}
}

func deploy(c *kcluster.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.Kubectl("label", "node", c.NodeName, "nvidia.com/gpu.present=true", "--overwrite"); err != nil {
		return err
	}
	dir, err := filepath.Abs(overlay)
	if err != nil {
		return err
	}
	if err := c.ApplyPath(dir); err != nil {
		return err
	}
	var pod string
	for pod == "" {
		out, err := c.Kubectl("get", "pods", "-n", "gpulet-system", "-l", "app.kubernetes.io/name=gpuletd", "-o", "jsonpath={.items[*].metadata.name}")
		if err == nil {
			pod = strings.TrimSpace(out)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the gpuletd DaemonSet made no pod: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if _, err := c.WaitPod(ctx, "gpulet-system", pod, kcluster.Ready, time.Minute); err != nil {
		return err
	}
	if err := waitAllocatable(ctx, c, unitsPerNode); err != nil {
		return err
	}
	return waitDRARegistered(ctx, c)
}

// waitDRARegistered waits until gpuletd's pod logs that the kubelet took its
// DRA driver's registration: before, the kubelet refuses the driver's claims
// and backs off for up to minutes.
func waitDRARegistered(ctx context.Context, c *kcluster.Cluster) error {
	for {
		out, err := c.Kubectl("logs", "-n", "gpulet-system", "-l", "app.kubernetes.io/name=gpuletd", "--tail=-1")
		if err == nil && strings.Contains(out, "DRA driver registered with the kubelet") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gpuletd's DRA driver is not registered with the kubelet: %w\n%s", ctx.Err(), out)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitAllocatable waits until the node offers n gpulet.io/unit.
func waitAllocatable(ctx context.Context, c *kcluster.Cluster, n int) error {
	want := fmt.Sprint(n)
	var got string
	for {
		out, err := c.Kubectl("get", "node", c.NodeName, "-o", `jsonpath={.status.allocatable.gpulet\.io/unit}`)
		if got = strings.TrimSpace(out); err == nil && got == want {
			return nil
		}
		select {
		case <-ctx.Done():
			logs, _ := c.Kubectl("logs", "-n", "gpulet-system", "-l", "app.kubernetes.io/name=gpuletd", "--tail=30")
			return fmt.Errorf("node allocatable gpulet.io/unit is %q, want %s: %w\ngpuletd's log:\n%s", got, want, ctx.Err(), logs)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// podLease is the lease gpuletd made for a pod, or nil: a pod lease of the
// device plugin once it names the pod (after its first pod-resources List),
// or a claim lease of the DRA driver.
func podLease(t *testing.T, g *client.Client, ns, pod string) *api.Lease {
	t.Helper()
	leases, err := g.LeasesAll(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range leases {
		if l.Binding == "pod" && l.Pod != nil && l.Pod.Namespace == ns && l.Pod.Name == pod ||
			l.Binding == "claim" && l.Claim != nil && l.Claim.Pod == ns+"/"+pod {
			return &leases[i]
		}
	}
	return nil
}

// waitPodLease waits for a pod's lease to be there (or gone).
func waitPodLease(t *testing.T, g *client.Client, ns, pod string, there bool, timeout time.Duration) *api.Lease {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := podLease(t, g, ns, pod)
		if (l != nil) == there {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s's lease: want there=%t, still not after %s", ns, pod, there, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// unitPod is a probe pod that asks for units of gpulet.io/unit.
func unitPod(name string, units int) string {
	return probePod(name, fmt.Sprintf("    resources:\n      limits: {gpulet.io/unit: %d}\n", units))
}

// deletePods deletes pods and waits until they are gone and gpuletd has
// ended their leases, so that the next test finds the node's units free.
func deletePods(t *testing.T, c *kcluster.Cluster, g *client.Client, names ...string) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	for _, n := range names {
		c.Kubectl("delete", "pod", "-n", "default", n, "--wait=false", "--ignore-not-found")
	}
	for _, n := range names {
		if _, err := c.WaitPod(ctx, "default", n, kcluster.Gone, 40*time.Second); err != nil {
			t.Error(err)
		}
	}
	for _, n := range names {
		waitPodLease(t, g, "default", n, false, 30*time.Second)
	}
}
