package k8s

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// probePod is a pod of the probe image on the host's network (the cluster
// has no pod network), with extra lines under its container (resources).
func probePod(name, containerExtra string) string {
	return probePodWith(name, "", containerExtra)
}

// probePodWith is probePod with extra lines under its spec as well.
func probePodWith(name, specExtra, containerExtra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
%s  containers:
  - name: probe
    image: %s
    imagePullPolicy: Never
%s`, name, specExtra, probeRef, containerExtra)
}

// TestClusterRunsAPod: the node is Ready and a pod of a locally imported
// image runs and logs. It also reports the cluster's start time, a pod's
// create → Running time and the components' memory.
func TestClusterRunsAPod(t *testing.T) {
	c := need(t)
	ctx := testCtx(t, 2*time.Minute)
	out, err := c.Kubectl("get", "node", c.NodeName, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}")
	if err != nil {
		t.Fatal(err)
	}
	if want := k8sVersion + " containerd://" + strings.TrimPrefix(containerdVersion, "v"); strings.TrimSpace(out) != want {
		t.Errorf("node runs %q, want %q", out, want)
	}
	t0 := time.Now()
	if err := c.Apply(probePod("smoke", "")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kubectl("delete", "pod", "-n", "default", "smoke", "--wait=false") })
	if _, err := c.WaitPod(ctx, "default", "smoke", kcluster.Running, time.Minute); err != nil {
		t.Fatal(err)
	}
	running := time.Since(t0)
	waitLog(t, c, "default", "smoke", "probe ready")
	rss := c.RSS()
	names := make([]string, 0, len(rss))
	var total int64
	for n, b := range rss {
		names = append(names, n)
		total += b
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " %s=%dMiB", n, rss[n]>>20)
	}
	t.Logf("cold start to node Ready: %.1fs, to schedulable: %.1fs; pod create -> Running: %.1fs; RSS %dMiB:%s",
		c.ReadyIn.Seconds(), c.SchedulableIn.Seconds(), running.Seconds(), total>>20, b.String())
}

// waitLog waits until a pod's log has want, and returns the log.
func waitLog(t *testing.T, c *kcluster.Cluster, ns, pod, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.Logs(ns, pod)
		if err == nil && strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s has not logged %q within 30s: %v\n%s", ns, pod, want, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
