package kcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Where the cluster keeps its state. The paths are fixed, not temporary, so
// that the test overlay (plain YAML) can name them, and so that a run killed
// before it could clean up is cleaned up by the next one; the host-wide lock
// makes them one run's at a time.
const (
	// StateDir holds etcd's data, containerd's root, the kubelet's root
	// and the PKI.
	StateDir = "/var/lib/gpulet-test-k8s"
	// RunDir holds containerd's state and socket, the pid files and the
	// saved sysctls.
	RunDir = "/run/gpulet-test-k8s"
	// KubeletRoot is the kubelet's --root-dir: device-plugins,
	// pod-resources, plugins and plugins_registry are under it.
	KubeletRoot = StateDir + "/kubelet"
	// CDIDir is the one folder containerd reads CDI specs from, so that
	// what the cluster's drivers write there goes with the cluster.
	CDIDir = RunDir + "/cdi"
	// LockFile is the host-wide lock a running cluster holds.
	LockFile = "/run/gpulet-test-k8s.lock"
	// CgroupRoot is the kubelet's cgroupRoot: pods' cgroups are under it
	// in every hierarchy, apart from any other kubelet's kubepods.
	CgroupRoot = "gpulet-test-k8s"
	// podLogsDir is the kubelet's podLogsDir. The kubelet also links each
	// container's log into /var/log/containers, a path it does not let
	// one change; cleanup removes the links that point here.
	podLogsDir       = StateDir + "/pod-logs"
	containerLogsDir = "/var/log/containers"
)

// kubeletSysctls are the host settings the kubelet changes at start
// (protectKernelDefaults off): saved before, written back after.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

const savedSysctls = RunDir + "/sysctl.saved"

// hostLock holds a lock file (LockFile). lock waits for another run's
// cluster to stop, saying so once, until ctx ends.
type hostLock struct{ f *os.File }

func lock(ctx context.Context, path string, logf func(string, ...any)) (*hostLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the host-wide cluster lock: %w", err)
	}
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &hostLock{f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !said {
			logf("another test run's Kubernetes cluster holds %s: waiting for it to stop", path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (l *hostLock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// saveSysctls records the kubelet's sysctls unless a record is there
// already: one left by a run that was killed holds the host's values.
func saveSysctls() error {
	if _, err := os.Stat(savedSysctls); err == nil {
		return nil
	}
	var b strings.Builder
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return fmt.Errorf("reading sysctl %s: %w", k, err)
		}
		fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(savedSysctls, []byte(b.String()), 0o600)
}

func restoreSysctls() error {
	b, err := os.ReadFile(savedSysctls)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	saved, err := parseSavedSysctls(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", savedSysctls, err)
	}
	var errs []error
	for _, kv := range saved {
		if err := os.WriteFile(filepath.Join("/proc/sys", kv[0]), []byte(kv[1]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s: %w", kv[0], err))
		}
	}
	if len(errs) == 0 {
		os.Remove(savedSysctls)
	}
	return errors.Join(errs...)
}

// parseSavedSysctls reads saveSysctls' record, "key=value" lines, and
// refuses any key but the kubelet's sysctls and any value but one number,
// since each is written into /proc/sys as root.
func parseSavedSysctls(text string) ([][2]string, error) {
	var out [][2]string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !validSysctl(k) {
			return nil, fmt.Errorf("bad line %q", line)
		}
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("sysctl %s: value %q is not a number", k, v)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func validSysctl(k string) bool {
	for _, s := range kubeletSysctls {
		if s == k {
			return true
		}
	}
	return false
}

// cgroupHierarchies are the folders under /sys/fs/cgroup where the kubelet
// and runc make cgroups: every v1 hierarchy, or the one v2 tree.
func cgroupHierarchies() ([]string, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil {
		return nil, fmt.Errorf("no cgroup filesystem at /sys/fs/cgroup: %w", err)
	}
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{"/sys/fs/cgroup"}, nil
	}
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		// cpu,cpuacct and its aliases are links to one hierarchy
		if e.IsDir() && e.Type()&os.ModeSymlink == 0 {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy under /sys/fs/cgroup")
	}
	return out, nil
}

// makeCgroupRoot makes CgroupRoot in every hierarchy: the kubelet refuses a
// cgroupRoot that does not exist. A v1 cpuset child starts with no CPUs and
// no memory nodes, so it gets its parent's.
func makeCgroupRoot() error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, CgroupRoot)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("making the cluster's cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("copying %s to the cluster's cgroup: %w", f, err)
				}
			}
		}
	}
	return nil
}

// killCgroups kills every process in the cluster's cgroups, then removes
// them, deepest first.
func killCgroups() error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil // no cgroups, nothing made
	}
	var dirs []string
	for _, h := range hs {
		filepath.WalkDir(filepath.Join(h, CgroupRoot), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	if len(dirs) == 0 {
		return nil
	}
	for _, d := range dirs {
		for _, pid := range cgroupProcs(d) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	var errs []error
	for _, d := range dirs {
		var err error
		// a killed process leaves its cgroup a moment later
		for i := 0; i < 50; i++ {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountsUnder lists the mount points at or under any of roots, deepest
// (longest) first, read from mountinfo.
func mountsUnder(mountinfo io.Reader, roots ...string) []string {
	var out []string
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		for _, r := range roots {
			if mp == r || strings.HasPrefix(mp, r+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts what is mounted under the cluster's folders: overlay
// roots of containers, their /dev/shm, pods' volumes.
func unmountAll() error {
	var errs []error
	for round := 0; round < 3; round++ {
		f, err := os.Open("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		mps := mountsUnder(f, StateDir, RunDir)
		f.Close()
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := unix.Unmount(mp, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
					errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// DevicePluginDir is where the kubelet serves device plugins' registration
// (kubelet.sock) and keeps its device checkpoint: a path fixed in the
// kubelet, whatever its --root-dir.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// hostDirs are folders outside the cluster's own that its components make
// when missing: the kubelet's device-plugin folder and log links,
// containerd's shim sockets. Those a cluster made are recorded in
// madeDirsFile and removed with what is in them; of those that were there
// before, only what the cluster put in is removed.
var hostDirs = []string{"/var/lib/kubelet", DevicePluginDir, containerLogsDir, "/run/containerd", "/run/containerd/s"}

const madeDirsFile = StateDir + "/made-host-dirs"

// recordHostDirs records which of hostDirs do not exist yet, and refuses
// to start where another kubelet serves DevicePluginDir: the two would
// share it.
func recordHostDirs() error {
	if conn, err := net.Dial("unix", filepath.Join(DevicePluginDir, "kubelet.sock")); err == nil {
		conn.Close()
		return fmt.Errorf("another kubelet serves %s, which a second kubelet on this host would share", DevicePluginDir)
	}
	var made []string
	for _, d := range hostDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			made = append(made, d)
		}
	}
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(madeDirsFile, []byte(strings.Join(made, "\n")), 0o644)
}

// cleanHostDirs removes what the cluster put in hostDirs: the kubelet's
// registration socket and device checkpoint (a next kubelet would read its
// allocations), plugins' sockets, log links into podLogsDir; then the
// folders it made.
func cleanHostDirs() error {
	b, err := os.ReadFile(madeDirsFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no cluster ran
	}
	if err != nil {
		return err
	}
	entries, _ := os.ReadDir(DevicePluginDir)
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 || e.Name() == "kubelet_internal_checkpoint" {
			os.Remove(filepath.Join(DevicePluginDir, e.Name()))
		}
	}
	entries, _ = os.ReadDir(containerLogsDir)
	for _, e := range entries {
		p := filepath.Join(containerLogsDir, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, podLogsDir+"/") {
			os.Remove(p)
		}
	}
	var errs []error
	for _, d := range strings.Fields(string(b)) {
		if !validHostDir(d) {
			errs = append(errs, fmt.Errorf("%s names %q, not a folder a cluster makes", madeDirsFile, d))
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func validHostDir(d string) bool {
	for _, h := range hostDirs {
		if d == h {
			return true
		}
	}
	return false
}
