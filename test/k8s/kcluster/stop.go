package kcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Stop deletes every pod, stops the components in reverse order, removes
// whatever containers are left, and restores the host: processes,
// mounts, cgroups, sysctls, folders. It is safe to call twice, and after a
// failed Start.
func (c *Cluster) Stop() error {
	if c == nil || c.lock == nil {
		return nil
	}
	c.logf("stopping the cluster")
	// first the controllers, which would make the pods of DaemonSets and
	// the like again
	c.stopProc("kube-controller-manager", 15*time.Second)
	if c.running("kube-apiserver") && c.running("kubelet") {
		// the kubelet ends the pods' containers itself, with their grace
		c.Kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=true", "--timeout=30s")
	}
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-apiserver", "etcd"} {
		c.stopProc(name, 15*time.Second)
	}
	c.removeContainers()
	c.stopProc("containerd", 15*time.Second)
	err := cleanupHost(c.logf)
	c.lock.unlock()
	c.lock = nil
	if err != nil {
		c.logf("restoring the host: %v", err)
	}
	return err
}

// removeContainers kills and deletes every task and container containerd
// still has, so that their shims exit.
func (c *Cluster) removeContainers() {
	ctr := func(args ...string) string {
		out, _ := exec.Command(c.bin("ctr"), append([]string{"--address", containerdSocket, "-n", "k8s.io"}, args...)...).Output()
		return string(out)
	}
	if !c.running("containerd") {
		return
	}
	tasks := strings.Fields(ctr("tasks", "ls", "-q"))
	for _, t := range tasks {
		ctr("tasks", "kill", "-s", "SIGKILL", t)
	}
	for _, t := range tasks {
		ctr("tasks", "delete", "-f", t)
	}
	for _, ct := range strings.Fields(ctr("containers", "ls", "-q")) {
		ctr("containers", "delete", ct)
	}
}

func (c *Cluster) running(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.procs[name]
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Log != nil {
		fmt.Fprintf(c.opts.Log, "kcluster: "+format+"\n", args...)
	}
}

// tailLogs is the end of each component's log, for a failed start.
func (c *Cluster) tailLogs() string {
	var b strings.Builder
	for _, name := range componentOrder {
		data, err := os.ReadFile(filepath.Join(c.LogDir, name+".log"))
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s log, last lines:\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}
