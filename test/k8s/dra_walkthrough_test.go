package k8s

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// TestDRAExampleClaim: deploy/kubernetes/example-claim.yaml, as
// docs/kubernetes.md's walk-through applies it, with only its image made the
// test's probe: the pod runs with a lease of the 4 units and the 10 GiB its
// template asks, as uid 1000.
func TestDRAExampleClaim(t *testing.T) {
	c, g := gpuletd(t)
	b, err := os.ReadFile("../../deploy/kubernetes/example-claim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	for old, new := range map[string]string{
		"image: nvcr.io/nvidia/pytorch:24.08-py3": "image: " + probeRef + "\n      imagePullPolicy: Never",
		`command: ["python", "train.py"]`:         `command: ["/probe"]`,
		"metadata:\n  name: quarter-gpu":          "metadata:\n  name: quarter-gpu\n  namespace: default",
		"metadata:\n  name: train-0":              "metadata:\n  name: train-0\n  namespace: default",
		"  restartPolicy: Never":                  "  restartPolicy: Never\n  hostNetwork: true",
	} {
		if !strings.Contains(y, old) {
			t.Fatalf("example-claim.yaml no longer holds %q", old)
		}
		y = strings.Replace(y, old, new, 1)
	}
	if err := c.Apply(y); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePods(t, c, g, "train-0") })
	if _, err := c.WaitPod(testCtx(t, 2*time.Minute), "default", "train-0", kcluster.Running, time.Minute); err != nil {
		t.Fatal(err)
	}
	l := claimLease(t, g, "default", "train-0")
	if l == nil || len(l.Units) != 4 || l.MemoryMiB != 10240 || l.Owner.UID != 1000 {
		t.Fatalf("the example's lease: %+v", l)
	}
}

// TestDRAClaimSurvivesKubeletRestart: a kubelet restart keeps a running
// pod's claim lease (and the pod): a prepare asked again answers the same.
func TestDRAClaimSurvivesKubeletRestart(t *testing.T) {
	c, g := gpuletd(t)
	ctx := testCtx(t, 3*time.Minute)
	if err := c.Apply(claimTemplate("units3", 3, "")); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(claimPod("dra-survivor", "units3", 1000)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePods(t, c, g, "dra-survivor") })
	if _, err := c.WaitPod(ctx, "default", "dra-survivor", kcluster.Running, time.Minute); err != nil {
		t.Fatal(err)
	}
	before := claimLease(t, g, "default", "dra-survivor")
	if before == nil {
		t.Fatal("no claim lease")
	}
	if err := c.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	// The kubelet is back once the device plugin has registered again and
	// counts its units: those of GPU 1 only, since the claim's instance on
	// GPU 0 serves uid 1000, which the device plugin's pods (uid 0) cannot
	// join under MPS.
	if err := waitAllocatable(ctx, c, unitsPerNode/2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	after := claimLease(t, g, "default", "dra-survivor")
	if after == nil || after.ID != before.ID {
		t.Fatalf("after the kubelet's restart the claim's lease is %+v, was %s", after, before.ID)
	}
	out, err := c.Kubectl("get", "pod", "-n", "default", "dra-survivor", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount}")
	if err != nil || strings.TrimSpace(out) != "Running 0" {
		t.Errorf("after the kubelet's restart the pod is %q (%v), want Running with no container restart", out, err)
	}
}
