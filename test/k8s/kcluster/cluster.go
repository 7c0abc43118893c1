// Package kcluster runs a real single-node Kubernetes for tests: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet on
// containerd and runc, all on 127.0.0.1, with private folders, and restores
// the host when it stops. It owns those processes, their folders and the
// host settings the kubelet changes; it does not build the binaries
// (test/k8s/build.sh does) nor know anything of gpulet.
//
// One cluster runs on a machine at a time: Start waits for the host-wide
// lock (LockFile) and Stop releases it. A run killed before Stop leaves
// processes and mounts behind; the next Start removes them first.
package kcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NodeName is the node's name, and its address. The kubelet refuses a
// loopback --node-ip but takes the address from a hostname override that
// is an IP, as Kubernetes' own hack/local-up-cluster.sh does.
const NodeName = "127.0.0.1"

// APIServerPort is the apiserver's port on 127.0.0.1, fixed so that
// in-cluster clients can be pointed at it in plain YAML (there is no
// kube-proxy to serve the kubernetes Service).
const APIServerPort = 16443

// Options say what to run.
type Options struct {
	// Bin is the folder of kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubelet, kubectl, containerd,
	// containerd-shim-runc-v2 and ctr.
	Bin string
	// Etcd and Runc are those binaries; found in PATH when empty.
	Etcd, Runc string
	// PauseImage is the archive of the sandbox image, imported first, and
	// PauseRef its reference.
	PauseImage, PauseRef string
	// FeatureGates are set on every component.
	FeatureGates map[string]bool
	// Log gets a line at each step of start and stop; nil for none.
	Log io.Writer
	// LogDir is where each component's log goes, <name>.log; it outlives
	// the cluster, for a failed test's reader. Empty: a folder under
	// RunDir, removed at Stop.
	LogDir string
}

// Cluster is one running cluster.
type Cluster struct {
	// Kubeconfig is an admin's kubeconfig (system:masters).
	Kubeconfig string
	// NodeName is the one node's name.
	NodeName string
	// Dir holds the PKI, the configs and LogDir.
	Dir string
	// LogDir holds each component's log, <name>.log.
	LogDir string
	// ReadyIn and SchedulableIn are how long Start took until the node
	// was Ready, and until pods could be placed on it.
	ReadyIn, SchedulableIn time.Duration

	opts        Options
	lock        *hostLock
	kubeletArgs []string
	healthzPort int // the kubelet's
	// hostSysctls are the host's values of the sysctls the kubelet
	// changes, read once an earlier run's cluster was cleaned up.
	hostSysctls map[string]string

	mu    sync.Mutex // guards procs
	procs map[string]*proc
}

// proc is one component the cluster started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// componentOrder is the order of start; Stop goes backwards.
var componentOrder = []string{"containerd", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// Start cleans what a killed run left, starts the cluster and waits until
// its node is Ready and schedulable. On error, what it started is stopped.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if os.Getuid() != 0 {
		return nil, errors.New("the kubelet needs root")
	}
	if _, err := cgroupHierarchies(); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		path *string
		name string
	}{{&opts.Etcd, "etcd"}, {&opts.Runc, "runc"}} {
		if *b.path == "" {
			p, err := exec.LookPath(b.name)
			if err != nil {
				return nil, fmt.Errorf("%s is not installed (make test installs Debian's etcd-server and runc): %w", b.name, err)
			}
			*b.path = p
		}
	}
	c = &Cluster{NodeName: NodeName, Dir: filepath.Join(StateDir, "cluster"), opts: opts, procs: map[string]*proc{}}
	c.LogDir = opts.LogDir
	if c.LogDir == "" {
		c.LogDir = filepath.Join(RunDir, "logs")
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if c.lock, err = lock(ctx, LockFile, c.logf); err != nil {
		return nil, err
	}
	if err := cleanupHost(c.logf); err != nil {
		c.lock.unlock()
		return nil, fmt.Errorf("cleaning up after an earlier run: %w", err)
	}
	c.hostSysctls = Sysctls()
	defer func() {
		if err != nil {
			if logs := c.tailLogs(); logs != "" {
				err = fmt.Errorf("%w\n%s", err, logs)
			}
			c.Stop()
		}
	}()
	t0 := time.Now()
	if err := recordHostDirs(); err != nil {
		return c, err
	}
	if err := c.prepare(); err != nil {
		return c, err
	}
	if err := c.startContainerd(ctx); err != nil {
		return c, err
	}
	c.logf("containerd up, pause image imported (%.1fs)", time.Since(t0).Seconds())
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	c.logf("apiserver ready (%.1fs)", time.Since(t0).Seconds())
	if err := c.startKubelet(); err != nil {
		return c, err
	}
	if err := c.waitNodeReady(ctx, 2*time.Minute); err != nil {
		return c, err
	}
	c.ReadyIn = time.Since(t0)
	c.logf("node %s Ready (%.1fs after start)", c.NodeName, c.ReadyIn.Seconds())
	if err := c.waitSchedulable(ctx, time.Minute); err != nil {
		return c, err
	}
	c.SchedulableIn = time.Since(t0)
	c.logf("node schedulable, default ServiceAccount made (%.1fs after start)", c.SchedulableIn.Seconds())
	return c, nil
}

// prepare makes the folders, PKI and configs, saves the sysctls the
// kubelet changes, and makes the pods' cgroup root.
func (c *Cluster) prepare() error {
	for _, d := range []string{c.Dir, c.LogDir, filepath.Join(RunDir, "pids"), CDIDir, KubeletRoot, podLogsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := saveSysctls(); err != nil {
		return err
	}
	if err := makeCgroupRoot(); err != nil {
		return err
	}
	pki := filepath.Join(c.Dir, "pki")
	if err := writePKI(pki, c.NodeName); err != nil {
		return fmt.Errorf("making the cluster's PKI: %w", err)
	}
	kport, err := freePort()
	if err != nil {
		return err
	}
	hport, err := freePort()
	if err != nil {
		return err
	}
	c.healthzPort = hport
	server := "https://127.0.0.1:" + strconv.Itoa(APIServerPort)
	files := map[string]string{
		c.file("containerd.toml"):          containerdConfig(c.opts.PauseRef, c.file("cni"), c.opts.Runc),
		c.file("cni/10-loopback.conflist"): cniLoopback,
		c.file("kubelet.yaml"):             kubeletConfig(pki, kport, hport, c.opts.FeatureGates),
	}
	for _, who := range []string{"admin", "controller-manager", "scheduler", "kubelet"} {
		files[c.file(who+".kubeconfig")] = kubeconfig(server, pki, who)
	}
	return writeFiles(files)
}

func (c *Cluster) file(name string) string { return filepath.Join(c.Dir, name) }

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.Bin, name) }

func (c *Cluster) startContainerd(ctx context.Context) error {
	// containerd starts its shims from PATH: the ones built with it first
	env := []string{"PATH=" + c.opts.Bin + ":" + os.Getenv("PATH")}
	if err := c.spawn("containerd", env, c.bin("containerd"), "--config", c.file("containerd.toml")); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd", 30*time.Second, func() bool {
		return exec.Command(c.bin("ctr"), "--address", containerdSocket, "version").Run() == nil
	}); err != nil {
		return err
	}
	return c.ImportImage(c.opts.PauseImage)
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	pki := filepath.Join(c.Dir, "pki")
	ports := make([]int, 4)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if err := c.spawn("etcd", nil, c.opts.Etcd, "--name", "gpulet-test", "--data-dir", filepath.Join(StateDir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "gpulet-test="+peerURL); err != nil {
		return err
	}
	gates := gateFlag(c.opts.FeatureGates)
	if err := c.spawn("kube-apiserver", nil, c.bin("kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(APIServerPort), "--advertise-address=127.0.0.1",
		"--tls-cert-file="+pki+"/apiserver.crt", "--tls-private-key-file="+pki+"/apiserver.key",
		"--client-ca-file="+pki+"/ca.crt",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki+"/sa.pub", "--service-account-signing-key-file="+pki+"/sa.key",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate="+pki+"/apiserver-kubelet-client.crt",
		"--kubelet-client-key="+pki+"/apiserver-kubelet-client.key",
		// no Service endpoints for 127.0.0.1, which 1.37 refuses: there is no
		// kube-proxy, and in-cluster clients are given the address
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true", "--profiling=false", "--feature-gates="+gates); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "the apiserver's /readyz", 2*time.Minute, func() bool {
		_, err := c.Kubectl("get", "--raw", "/readyz")
		return err == nil
	}); err != nil {
		return err
	}
	kcm := c.file("controller-manager.kubeconfig")
	if err := c.spawn("kube-controller-manager", nil, c.bin("kube-controller-manager"),
		"--kubeconfig="+kcm, "--authentication-kubeconfig="+kcm, "--authorization-kubeconfig="+kcm,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]), "--leader-elect=false",
		"--service-account-private-key-file="+pki+"/sa.key", "--root-ca-file="+pki+"/ca.crt",
		"--use-service-account-credentials=true", "--allocate-node-cidrs=false",
		"--profiling=false", "--feature-gates="+gates); err != nil {
		return err
	}
	sched := c.file("scheduler.kubeconfig")
	return c.spawn("kube-scheduler", nil, c.bin("kube-scheduler"),
		"--kubeconfig="+sched, "--authentication-kubeconfig="+sched, "--authorization-kubeconfig="+sched,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[3]), "--leader-elect=false",
		"--profiling=false", "--feature-gates="+gates)
}

func (c *Cluster) startKubelet() error {
	if c.kubeletArgs == nil {
		c.kubeletArgs = []string{"--config=" + c.file("kubelet.yaml"), "--kubeconfig=" + c.file("kubelet.kubeconfig"),
			"--hostname-override=" + c.NodeName, "--root-dir=" + KubeletRoot, "--v=2"}
	}
	return c.spawn("kubelet", nil, c.bin("kubelet"), c.kubeletArgs...)
}

// RestartKubelet stops the kubelet (SIGTERM; its pods keep running) and
// starts it again, then waits until the node is Ready.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	c.stopProc("kubelet", 20*time.Second)
	if err := c.startKubelet(); err != nil {
		return err
	}
	// the node stays Ready in the apiserver while the kubelet is down for
	// less than the grace period, so wait for the new kubelet's healthz too
	healthz := "http://127.0.0.1:" + strconv.Itoa(c.healthzPort) + "/healthz"
	if err := c.waitFor(ctx, "the restarted kubelet's "+healthz, time.Minute, func() bool {
		resp, err := http.Get(healthz)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return err
	}
	return c.waitNodeReady(ctx, time.Minute)
}

// spawn starts a component in its own process group (so that a terminal's
// ^C reaches the test, which then stops it in order) with its output in
// LogDir, and records its pid for a later run's cleanup.
func (c *Cluster) spawn(name string, env []string, bin string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(c.LogDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return writePidFile(name, cmd.Process.Pid, bin)
}

// stopProc sends SIGTERM, waits up to grace, then SIGKILL.
func (c *Cluster) stopProc(name string, grace time.Duration) {
	c.mu.Lock()
	p := c.procs[name]
	delete(c.procs, name)
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
	os.Remove(pidFile(name))
}

// exited says which component has exited, if any, and how.
func (c *Cluster) exited() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range componentOrder {
		p := c.procs[name]
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v (its log: %s)", name, p.err, filepath.Join(c.LogDir, name+".log"))
		default:
		}
	}
	return nil
}

// waitFor polls ok every 200 ms until it holds, a component exits, ctx ends
// or timeout passes.
func (c *Cluster) waitFor(ctx context.Context, what string, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if err := c.exited(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

func (c *Cluster) waitNodeReady(ctx context.Context, timeout time.Duration) error {
	return c.waitFor(ctx, "node "+c.NodeName+" Ready", timeout, func() bool {
		out, err := c.Kubectl("get", "node", c.NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && strings.TrimSpace(out) == "True"
	})
}

// waitSchedulable waits until pods can be made and placed: the
// not-ready taint gone and the default ServiceAccount made.
func (c *Cluster) waitSchedulable(ctx context.Context, timeout time.Duration) error {
	return c.waitFor(ctx, "node schedulable and default ServiceAccount", timeout, func() bool {
		taints, err := c.Kubectl("get", "node", c.NodeName, "-o", "jsonpath={.spec.taints}")
		if err != nil || strings.Contains(taints, "not-ready") {
			return false
		}
		_, err = c.Kubectl("get", "serviceaccount", "default", "-n", "default")
		return err == nil
	})
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port on 127.0.0.1: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
