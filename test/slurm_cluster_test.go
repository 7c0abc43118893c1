package test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// slurmNodeName is the single node's name: slurmd runs as it (-N) and Slurm's
// v1 cgroups are made under slurm_<name>.
const slurmNodeName = "gpuletnode"

// slurmKillWait is slurm.conf's KillWait: the seconds between SIGTERM and
// SIGKILL when a job is cancelled.
const slurmKillWait = 2

// slurmCluster is a one-node Slurm (munged, slurmctld, slurmd) that the test
// starts with a private config and state under t.TempDir(), on loopback, in
// front of a gpuletd on the simulated backend whose socket two job users
// reach.
type slurmCluster struct {
	t testing.TB
	// prolog is gpulet under its task-prolog name.
	prolog string
	d      *e2e.Daemon
	etc    string // slurm.conf, gres.conf, cgroup.conf, the epilog
	out    string // the jobs' working folder, writable by the users
	logs   string
	gpulet string // gpulet and gpurun, copied where the users may run them
	gpurun string
	users  [2]testUser
	conf   slurmConf
	procs  []*exec.Cmd
}

// slurmConf fills slurm.conf.
type slurmConf struct {
	Dir, MungeSocket, Cgroup, TaskProlog, Epilog string
	CtldPort, NodePort                           int
	KillWait                                     int
	Node                                         string
}

const slurmConfText = `ClusterName=gpulet
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={{.CtldPort}}
SlurmdPort={{.NodePort}}
AuthType=auth/munge
AuthInfo=socket={{.MungeSocket}}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={{.Dir}}/ctld
SlurmdSpoolDir={{.Dir}}/spool
SlurmctldPidFile={{.Dir}}/ctld.pid
SlurmdPidFile={{.Dir}}/slurmd.pid
SlurmctldLogFile={{.Dir}}/log/slurmctld.log
SlurmdLogFile={{.Dir}}/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu,shard
MpiDefault=none
ReturnToService=2
KillWait={{.KillWait}}
{{if .TaskProlog}}TaskProlog={{.TaskProlog}}
{{end}}{{if .Epilog}}Epilog={{.Epilog}}
{{end}}NodeName={{.Node}} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=8 Gres=gpu:2,shard:32 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`

// startSlurm starts gpuletd and the cluster, or skips saying what is missing.
func startSlurm(t testing.TB) *slurmCluster {
	t.Helper()
	needUserTools(t)
	for _, tool := range []string{"munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue", "scontrol", "sinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (make test installs Debian's slurmctld, slurmd, slurm-client and munge as root): %v", tool, err)
		}
	}
	cgroup := slurmCgroupPlugin(t)
	munge, err := user.Lookup("munge")
	if err != nil {
		t.Skip("no munge user (Debian's munge package makes it):", err)
	}
	c := &slurmCluster{t: t}
	group := addGroup(t)
	c.users = [2]testUser{addUser(t, group), addUser(t, group)}
	c.d = c.startGpuletd(group)
	c.gpulet = copyForOthers(t, e2e.Bin("gpulet"))
	c.gpurun = copyForOthers(t, e2e.Bin("gpurun"))

	// Every folder on the way is reachable by munge and the job users.
	base := t.TempDir()
	os.Chmod(filepath.Dir(base), 0o755)
	os.Chmod(base, 0o755)
	c.etc, c.out, c.logs = filepath.Join(base, "etc"), filepath.Join(base, "out"), filepath.Join(base, "log")
	mungeDir := filepath.Join(base, "munge")
	for _, d := range []string{c.etc, c.out, c.logs, mungeDir, filepath.Join(base, "ctld"), filepath.Join(base, "spool"), filepath.Join(base, "dev")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(c.out, 0o1777)
	// Fake /dev/nvidiaN: Slurm sets CUDA_VISIBLE_DEVICES only for character
	// devices. Their major is NVIDIA's, their minor the NVML index.
	for i := 0; i < 2; i++ {
		if err := unix.Mknod(filepath.Join(base, "dev", "nvidia"+strconv.Itoa(i)), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Skip("cannot make the fake GPU device files Slurm's gres needs:", err)
		}
	}
	c.startMunge(mungeDir, munge)

	// The task prolog is gpulet under its hook name. The epilog, which
	// slurmd runs with an environment of its own, names the test's private
	// socket; a site's, on the default socket, is a link too.
	prolog := filepath.Join(filepath.Dir(c.gpulet), "gpulet-slurm-task-prolog")
	if err := os.Symlink(c.gpulet, prolog); err != nil {
		t.Fatal(err)
	}
	epilog := filepath.Join(c.etc, "epilog")
	os.WriteFile(epilog, []byte(fmt.Sprintf("#!/bin/sh\nexec %s --socket %s slurm epilog\n", c.gpulet, c.d.Socket)), 0o755)
	c.prolog = prolog
	c.conf = slurmConf{Dir: base, MungeSocket: filepath.Join(mungeDir, "munge.sock"), Cgroup: cgroup, TaskProlog: prolog, Epilog: epilog,
		CtldPort: freeTCPPort(t), NodePort: freeTCPPort(t), KillWait: slurmKillWait, Node: slurmNodeName}
	c.writeConf()
	c.writeGres()
	os.WriteFile(filepath.Join(c.etc, "cgroup.conf"), []byte("CgroupPlugin="+cgroup+"\nCgroupAutomount=no\nConstrainDevices=no\n"), 0o644)

	t.Cleanup(c.stop)
	c.spawn("slurmctld", nil, "slurmctld", "-D", "-i")
	c.spawn("slurmd", nil, "slurmd", "-D", "-N", slurmNodeName)
	c.waitIdle()
	return c
}

// slurmCgroupPlugin is Slurm's cgroup plugin for this machine's layout, or a
// skip where proctrack/cgroup cannot run.
func slurmCgroupPlugin(t testing.TB) string {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil {
		t.Skip("no /sys/fs/cgroup: Slurm's proctrack/cgroup cannot run:", err)
	}
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return "cgroup/v2"
	}
	probe := filepath.Join("/sys/fs/cgroup/freezer", "gpulet-probe-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		t.Skip("cannot make a cgroup in the v1 freezer hierarchy, which Slurm's proctrack/cgroup needs:", err)
	}
	os.Remove(probe)
	return "cgroup/v1"
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startGpuletd starts gpuletd with 2 simulated GPUs of 16 units, two MPS
// instances each (so that two users' jobs share a GPU), MPS on where its
// control binary is installed.
func (c *slurmCluster) startGpuletd(group string) *e2e.Daemon {
	args := []string{"--socket-group", group, "--units-per-client", "8", "--clients-per-instance", "8", "--instances-per-gpu", "2", "--units-per-gpu", "16"}
	if control, err := exec.LookPath("nvidia-cuda-mps-control"); err == nil {
		// The control daemon listens only in pipe folders of at most 87 bytes.
		runDir, err := os.MkdirTemp("/tmp", "gs")
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() {
			killControlDaemons(runDir)
			os.RemoveAll(runDir)
		})
		args = append(args, "--mps", "on", "--mps-control", control, "--run-dir", runDir)
	}
	d := e2e.Start(c.t, args...)
	os.Chmod(filepath.Dir(d.Dir), 0o755)
	os.Chmod(d.Dir, 0o755)
	return d
}

func (c *slurmCluster) startMunge(dir string, munge *user.User) {
	t := c.t
	uid, _ := strconv.Atoi(munge.Uid)
	gid, _ := strconv.Atoi(munge.Gid)
	key := make([]byte, 1024)
	rand.Read(key)
	keyFile := filepath.Join(dir, "munge.key")
	if err := os.WriteFile(keyFile, key, 0o400); err != nil {
		t.Fatal(err)
	}
	// munged refuses to run as root and wants its files its own.
	for _, p := range []string{dir, keyFile} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "munge.sock")
	c.spawn("munged", &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, "munged", "--foreground", "--socket="+sock, "--key-file="+keyFile,
		"--pid-file="+filepath.Join(dir, "munged.pid"), "--seed-file="+filepath.Join(dir, "seed"), "--log-file="+filepath.Join(dir, "munged.log"))
	testutil.Eventually(t, "munged to listen", func() bool { _, err := os.Stat(sock); return err == nil })
}

// spawn starts a daemon in the foreground; stop ends it.
func (c *slurmCluster) spawn(name string, cred *syscall.Credential, args ...string) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = c.env()
	log, err := os.Create(filepath.Join(c.logs, name+".out"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("%s: %v", name, err)
	}
	c.procs = append(c.procs, cmd)
}

// env is the environment of Slurm's daemons and clients.
func (c *slurmCluster) env() []string {
	return []string{"PATH=" + filepath.Dir(c.gpurun) + ":" + filepath.Dir(c.gpulet) + ":/usr/sbin:/usr/bin:/sbin:/bin",
		"SLURM_CONF=" + filepath.Join(c.etc, "slurm.conf"), "GPULET_SOCKET=" + c.d.Socket, "LANG=C"}
}

func (c *slurmCluster) writeConf() {
	var b bytes.Buffer
	if err := template.Must(template.New("slurm.conf").Parse(slurmConfText)).Execute(&b, c.conf); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.etc, "slurm.conf"), b.Bytes(), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// writeGres writes the gres.conf that gpulet slurm gres prints for the
// running gpuletd: the check that its lines are what Slurm takes.
func (c *slurmCluster) writeGres() {
	cmd := exec.Command(e2e.Bin("gpulet"), "--socket", c.d.Socket, "slurm", "gres", "--node", slurmNodeName, "--dev-prefix", filepath.Join(c.conf.Dir, "dev", "nvidia"))
	out, code := e2e.Output(c.t, cmd)
	if code != 0 {
		c.t.Fatalf("gpulet slurm gres: exit %d\n%s", code, out)
	}
	gres, slurmConf, ok := strings.Cut(out, "# slurm.conf\n")
	if !ok || !strings.Contains(slurmConf, "Gres=gpu:2,shard:32") {
		c.t.Fatalf("gpulet slurm gres printed:\n%s\nwant the slurm.conf part with Gres=gpu:2,shard:32, as the node is written", out)
	}
	os.WriteFile(filepath.Join(c.etc, "gres.conf"), []byte(gres), 0o644)
}

// waitIdle waits for the node to register; a daemon that exits instead
// cannot run here, and the test is skipped with its log.
func (c *slurmCluster) waitIdle() {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range c.procs {
			if p.ProcessState == nil && processExited(p.Process.Pid) {
				name := filepath.Base(p.Path)
				log, _ := os.ReadFile(filepath.Join(c.logs, name+".out"))
				dlog, _ := os.ReadFile(filepath.Join(c.logs, name+".log"))
				c.t.Skipf("%s cannot run here: it exited at start\n%s\n%s", name, log, tail(dlog, 2000))
			}
		}
		out, _ := c.asRoot("sinfo", "-h", "-N", "-o", "%T")
		if strings.TrimSpace(string(out)) == "idle" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(c.logs, "slurmd.log"))
	c.t.Fatalf("the Slurm node did not become idle within 30s\n%s", tail(log, 3000))
}

// processExited reports whether pid is a zombie or gone: a child that
// exited but was not waited for.
func processExited(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// stop cancels what still runs, stops the daemons and removes the node's
// cgroups.
func (c *slurmCluster) stop() {
	for _, u := range c.users {
		c.asRoot("scancel", "-u", u.name)
	}
	deadline := time.Now().Add(time.Duration(slurmKillWait+5) * time.Second)
	for time.Now().Before(deadline) {
		out, err := c.asRoot("squeue", "-h")
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	if c.t.Failed() {
		for _, name := range []string{"slurmctld.log", "slurmd.log"} {
			b, _ := os.ReadFile(filepath.Join(c.logs, name))
			c.t.Logf("%s:\n%s", name, tail(b, 4000))
		}
	}
	// Slurm leaves the node's own cgroup folders behind.
	for _, top := range []string{"/sys/fs/cgroup/freezer/slurm_" + slurmNodeName, "/sys/fs/cgroup/system.slice/" + slurmNodeName + "_slurmstepd.scope"} {
		removeCgroupTree(top)
	}
}

// removeCgroupTree removes empty cgroup folders, deepest first.
func removeCgroupTree(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	os.Remove(dir)
}

// setEpilog turns the epilog on or off and waits until slurmctld has read
// the config again.
func (c *slurmCluster) setEpilog(on bool) {
	c.conf.Epilog = ""
	if on {
		c.conf.Epilog = filepath.Join(c.etc, "epilog")
	}
	c.reconfigure("Epilog", c.conf.Epilog)
}

// setTaskProlog makes path the task prolog; "" for none (a plain step).
func (c *slurmCluster) setTaskProlog(path string) {
	c.conf.TaskProlog = path
	c.reconfigure("TaskProlog", path)
}

// reconfigure writes the config, has slurmctld and slurmd read it again,
// and waits until slurmctld shows key as want ("" shows as "(null)").
func (c *slurmCluster) reconfigure(key, want string) {
	if want == "" {
		want = "(null)"
	}
	c.writeConf()
	reads := c.slurmdConfigReads()
	if out, err := c.asRoot("scontrol", "reconfigure"); err != nil {
		c.t.Fatalf("scontrol reconfigure: %v\n%s", err, out)
	}
	testutil.Eventually(c.t, "slurmctld to read "+key+"="+want, func() bool {
		out, _ := c.asRoot("scontrol", "show", "config")
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == key {
				return strings.TrimSpace(v) == want
			}
		}
		return false
	})
	// slurmd reads it on the same reconfigure, once its requests under way
	// are done: seconds later when a job has just ended.
	testutil.Eventually(c.t, "slurmd to read the config again", func() bool { return c.slurmdConfigReads() > reads })
}

// slurmdConfigReads counts the times slurmd read its config, by the line it
// logs each time: the node is declared with eight one-core sockets, which
// slurmd finds differ from the machine (SlurmdParameters=config_overrides
// keeps the declared ones).
func (c *slurmCluster) slurmdConfigReads() int {
	log, _ := os.ReadFile(filepath.Join(c.logs, "slurmd.log"))
	return bytes.Count(log, []byte("Node configuration differs from hardware"))
}
