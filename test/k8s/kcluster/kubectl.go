package kcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Kubectl runs kubectl as the cluster's admin and returns its stdout; the
// error carries stderr.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	return c.kubectlIn(nil, args...)
}

func (c *Cluster) kubectlIn(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command(c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Apply applies manifests given as YAML text.
func (c *Cluster) Apply(yaml string) error {
	_, err := c.kubectlIn([]byte(yaml), "apply", "-f", "-")
	return err
}

// ApplyPath applies a manifest file, or a kustomization folder (kubectl
// apply -k) as a cluster admin applies one.
func (c *Cluster) ApplyPath(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	flag := "-f"
	if fi.IsDir() {
		flag = "-k"
	}
	_, err = c.Kubectl("apply", flag, path)
	return err
}

// Pod is what WaitPod reads of a pod.
type Pod struct {
	Metadata struct {
		Name, Namespace, UID string
	}
	Spec struct {
		NodeName string
	}
	Status struct {
		Phase      string
		Reason     string
		Message    string
		Conditions []struct{ Type, Status, Reason, Message string }
	}
}

// Condition says whether a pod is as a test waits for it to be. Gone is
// true of a pod that no longer exists; the others of one that does.
type Condition func(p *Pod, gone bool) bool

// Conditions WaitPod takes.
var (
	Running Condition = func(p *Pod, gone bool) bool { return !gone && p.Status.Phase == "Running" }
	Ready   Condition = func(p *Pod, gone bool) bool { return !gone && p.condition("Ready") == "True" }
	Failed  Condition = func(p *Pod, gone bool) bool { return !gone && p.Status.Phase == "Failed" }
	Gone    Condition = func(p *Pod, gone bool) bool { return gone }
	// Unschedulable: the scheduler tried and said why not (in the
	// PodScheduled condition's message).
	Unschedulable Condition = func(p *Pod, gone bool) bool {
		return !gone && p.condition("PodScheduled") == "False" && p.conditionReason("PodScheduled") == "Unschedulable"
	}
)

func (p *Pod) condition(t string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func (p *Pod) conditionReason(t string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Reason
		}
	}
	return ""
}

// GetPod reads a pod; nil and no error when it does not exist.
func (c *Cluster) GetPod(ns, name string) (*Pod, error) {
	out, err := c.Kubectl("get", "pod", "-n", ns, name, "-o", "json", "--ignore-not-found")
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(out) == "" {
		return nil, nil
	}
	var p Pod
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	return &p, nil
}

// WaitPod waits until the pod meets cond, and returns it as last read
// (nil once gone). On timeout the error has the pod's description and
// events.
func (c *Cluster) WaitPod(ctx context.Context, ns, name string, cond Condition, timeout time.Duration) (*Pod, error) {
	var last *Pod
	err := c.waitFor(ctx, "pod "+ns+"/"+name, timeout, func() bool {
		p, err := c.GetPod(ns, name)
		if err != nil {
			return false
		}
		last = p
		if p == nil {
			return cond(&Pod{}, true)
		}
		return cond(p, false)
	})
	if err != nil {
		desc, _ := c.Kubectl("describe", "pod", "-n", ns, name)
		return last, fmt.Errorf("%w\n%s", err, desc)
	}
	return last, nil
}

// Logs is a pod's (first container's) log.
func (c *Cluster) Logs(ns, pod string) (string, error) {
	return c.Kubectl("logs", "-n", ns, pod)
}

// ImportImage imports an image archive (docker-archive or OCI layout tar)
// into the CRI's image store: the cluster has no registry, so pods name
// local images with imagePullPolicy Never.
func (c *Cluster) ImportImage(archive string) error {
	out, err := exec.Command(c.bin("ctr"), "--address", containerdSocket, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing %s: %w: %s", archive, err, out)
	}
	return nil
}

// RSS is each component's resident memory in bytes, and the containerd
// shims' together under "containerd-shims".
func (c *Cluster) RSS() map[string]int64 {
	out := map[string]int64{}
	c.mu.Lock()
	for name, p := range c.procs {
		out[name] = rss(p.cmd.Process.Pid)
	}
	c.mu.Unlock()
	for _, pid := range shimPids() {
		out["containerd-shims"] += rss(pid)
	}
	return out
}

func rss(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
