package kcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pidFile records a component's pid and binary, so that a run that was
// killed before it could stop its cluster is cleaned up by the next one.
func pidFile(name string) string { return filepath.Join(RunDir, "pids", name) }

func writePidFile(name string, pid int, bin string) error {
	return os.WriteFile(pidFile(name), []byte(strconv.Itoa(pid)+"\n"+bin+"\n"), 0o644)
}

// recordedPids are the live processes the pid files name: a pid whose
// process runs another binary now is not ours any more.
func recordedPids() []int {
	entries, _ := os.ReadDir(filepath.Join(RunDir, "pids"))
	var pids []int
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(RunDir, "pids", e.Name()))
		if err != nil {
			continue
		}
		pid, bin, ok := parsePidFile(string(b))
		if !ok {
			continue
		}
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && exe == bin {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parsePidFile reads writePidFile's "pid\nbinary\n"; not ok for anything
// else, or for a pid that cannot be a component's.
func parsePidFile(text string) (pid int, bin string, ok bool) {
	pidText, bin, found := strings.Cut(strings.TrimSpace(text), "\n")
	pid, err := strconv.Atoi(pidText)
	if !found || err != nil || pid <= 1 || !filepath.IsAbs(bin) {
		return 0, "", false
	}
	return pid, bin, true
}

// shimPids are the containerd shims serving the cluster's containerd: they
// outlive it, and name its socket on their command line.
func shimPids() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == containerdSocket {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killAndWait sends SIGKILL to pids and waits until they are gone.
func killAndWait(pids []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			// a zombie whose parent is gone is reaped by init; one of ours
			// by its Wait goroutine
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err != nil || strings.Contains(string(b), ") Z ") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// cleanupHost leaves the host as it was before any cluster ran: every
// process the cluster started (components, shims, containers) killed,
// mounts under its folders unmounted, its cgroups removed, the sysctls
// written back and its folders removed. Stop calls it after the orderly
// stop, Start before anything else, for a run that was killed.
func cleanupHost(logf func(string, ...any)) error {
	pids := append(recordedPids(), shimPids()...)
	if len(pids) > 0 {
		logf("killing %d processes an earlier cluster left: %v", len(pids), pids)
		killAndWait(pids)
	}
	var errs []error
	if err := killCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if err := restoreSysctls(); err != nil {
		errs = append(errs, err)
	}
	if err := cleanHostDirs(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// leave the folders: what is still mounted there must not be
		// removed through its mount
		return errors.Join(errs...)
	}
	for _, d := range []string{StateDir, RunDir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Sysctls are the current values of the sysctls the kubelet changes.
func Sysctls() map[string]string {
	out := map[string]string{}
	for _, k := range kubeletSysctls {
		v, _ := os.ReadFile(filepath.Join("/proc/sys", k))
		out[k] = strings.TrimSpace(string(v))
	}
	return out
}

// CheckRestored says what the stopped cluster left on the host, if
// anything: processes, mounts, cgroups, folders, or sysctls other than the
// host's before it started.
func (c *Cluster) CheckRestored() error {
	before := c.hostSysctls
	var errs []error
	if pids := append(recordedPids(), shimPids()...); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes left: %v", pids))
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		if mps := mountsUnder(f, StateDir, RunDir); len(mps) > 0 {
			errs = append(errs, fmt.Errorf("mounts left: %v", mps))
		}
		f.Close()
	}
	if hs, err := cgroupHierarchies(); err == nil {
		for _, h := range hs {
			if _, err := os.Stat(filepath.Join(h, CgroupRoot)); err == nil {
				errs = append(errs, fmt.Errorf("cgroup left: %s", filepath.Join(h, CgroupRoot)))
			}
		}
	}
	for _, d := range []string{StateDir, RunDir} {
		if _, err := os.Stat(d); err == nil {
			errs = append(errs, fmt.Errorf("folder left: %s", d))
		}
	}
	entries, _ := os.ReadDir(DevicePluginDir)
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 || e.Name() == "kubelet_internal_checkpoint" {
			errs = append(errs, fmt.Errorf("left in %s: %s", DevicePluginDir, e.Name()))
		}
	}
	for k, v := range Sysctls() {
		if before[k] != v {
			errs = append(errs, fmt.Errorf("sysctl %s is %s, was %s", k, v, before[k]))
		}
	}
	return errors.Join(errs...)
}
