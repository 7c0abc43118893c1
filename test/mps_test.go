package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// startMPSDaemon starts gpuletd with MPS on and a short run dir: the control
// daemon listens only in pipe folders of at most 87 bytes.
func startMPSDaemon(t *testing.T, extra ...string) (d *e2e.Daemon, runDir string) {
	t.Helper()
	control, err := exec.LookPath("nvidia-cuda-mps-control")
	if err != nil {
		t.Skip("nvidia-cuda-mps-control is not installed (make test installs Debian's nvidia-cuda-mps as root):", err)
	}
	runDir, err = os.MkdirTemp("/tmp", "gm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		killControlDaemons(runDir)
		os.RemoveAll(runDir)
	})
	args := append([]string{"--mps", "on", "--mps-control", control, "--run-dir", runDir}, extra...)
	return e2e.Start(t, args...), runDir
}

// controlDaemons lists the pids of the MPS control daemons whose pipe
// folder is under runDir.
func controlDaemons(runDir string) map[string]int {
	out := map[string]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// The daemon runs as "nvidia-cuda-mps-control -d"; the same binary
		// without -d is a passing client (gpuletd's probes, answers below).
		args := bytes.Split(bytes.TrimSuffix(cmdline(e.Name()), []byte{0}), []byte{0})
		if len(args) != 2 || !bytes.HasSuffix(args[0], []byte("nvidia-cuda-mps-control")) || string(args[1]) != "-d" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if dir, ok := strings.CutPrefix(string(kv), "CUDA_MPS_PIPE_DIRECTORY="); ok && strings.HasPrefix(dir, runDir+"/") {
				out[dir] = pid
			}
		}
	}
	return out
}

func killControlDaemons(runDir string) {
	for _, pid := range controlDaemons(runDir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func cmdline(pid string) []byte {
	b, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	return b
}

// answers reports whether a control daemon answers on pipeDir.
func answers(pipeDir string) bool {
	cmd := exec.Command("nvidia-cuda-mps-control")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipeDir, "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = strings.NewReader("get_server_list\n")
	return cmd.Run() == nil
}

func TestMPSInstancesLifecycle(t *testing.T) {
	d, runDir := startMPSDaemon(t, "--units-per-client", "1", "--instances-per-gpu", "2", "--clients-per-instance", "4")
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.MPS != "on" {
		t.Fatalf("mps %q", s.MPS)
	}
	for _, g := range s.GPUs {
		if len(g.Instances) != 2 || g.State != api.GPUWorking {
			t.Fatalf("GPU %d: %+v", g.Index, g)
		}
		for _, in := range g.Instances {
			if in.State != api.InstanceRunning {
				t.Fatalf("GPU %d instance %d is %s", g.Index, in.Instance, in.State)
			}
		}
	}
	daemons := controlDaemons(runDir)
	if len(daemons) != 4 {
		t.Fatalf("%d control daemons, want 4: %v", len(daemons), daemons)
	}

	// A lease's env points at a live pipe folder of its instance.
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m", MemoryMiB: 4096})
	if err != nil {
		t.Fatal(err)
	}
	pipe := l.Env["CUDA_MPS_PIPE_DIRECTORY"]
	want := filepath.Join(runDir, "mps", l.GPU.UUID, strconv.Itoa(l.Instance), "pipe")
	if pipe != want || !answers(pipe) || l.Env["CUDA_MPS_LOG_DIRECTORY"] == "" ||
		l.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" || l.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" {
		t.Fatalf("lease env %v (want pipe %s answering)", l.Env, want)
	}

	// kill -9 of one control daemon: its GPU is degraded, then running again.
	victim := filepath.Join(runDir, "mps", s.GPUs[1].UUID, "0", "pipe")
	syscall.Kill(daemons[victim], syscall.SIGKILL)
	testutil.Eventually(t, "GPU 1 degraded", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[1].State == api.GPUDegraded && s.GPUs[1].Instances[0].State != api.InstanceRunning
	})
	testutil.Eventually(t, "GPU 1 working again", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[1].State == api.GPUWorking && s.GPUs[1].Instances[0].State == api.InstanceRunning
	})
	if !answers(victim) {
		t.Fatal("restarted control daemon does not answer")
	}

	// A restart of gpuletd adopts the running daemons instead of starting more.
	before := controlDaemons(runDir)
	d.Kill9()
	d.Restart()
	after := controlDaemons(runDir)
	if len(after) != 4 {
		t.Fatalf("%d control daemons after restart, want 4", len(after))
	}
	for dir, pid := range before {
		if after[dir] != pid {
			t.Fatalf("instance %s: pid %d before restart, %d after: not adopted", dir, pid, after[dir])
		}
	}

	// A clean stop quits the idle instances and leaves no process behind.
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "control daemons to quit", func() bool { return len(controlDaemons(runDir)) == 0 })
}

func TestMPSOnWithoutBinaryRefusesToStart(t *testing.T) {
	out, err := exec.Command(e2e.Bin("gpuletd"), "--backend", "sim", "--mps", "on", "--mps-control", "/nonexistent/mps-control",
		"--socket", filepath.Join(t.TempDir(), "s"), "--run-dir", t.TempDir(), "--mount", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nvidia-cuda-mps") {
		t.Fatalf("gpuletd --mps on without the binary: %v\n%s", err, out)
	}
}

// TestMPSAutoRunsOnWithoutWorkingMPS: with --mps auto, a pipe folder too long
// for the control daemon or a control binary that fails leaves MPS off, says
// why, and gpuletd serves; with --mps on the same problems stop it with the
// reason.
func TestMPSAutoRunsOnWithoutWorkingMPS(t *testing.T) {
	control, err := exec.LookPath("nvidia-cuda-mps-control")
	if err != nil {
		t.Skip("nvidia-cuda-mps-control is not installed (make test installs Debian's nvidia-cuda-mps as root):", err)
	}
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, control, why string
		longRunDir         bool
	}{
		{name: "pipe folder too long", control: control, why: "at most 87", longRunDir: true},
		{name: "control binary fails", control: falseBin, why: "no MPS control daemon started"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			runDir, err := os.MkdirTemp("/tmp", "gm")
			if err != nil {
				t.Fatal(err)
			}
			if c.longRunDir {
				runDir = filepath.Join(runDir, strings.Repeat("r", 60))
			}
			t.Cleanup(func() {
				killControlDaemons(runDir)
				os.RemoveAll(runDir)
			})
			d := e2e.Start(t, "--mps", "auto", "--mps-control", c.control, "--run-dir", runDir)
			s, err := d.Client.Snapshot(e2e.Ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if s.MPS != "off" || !strings.Contains(d.Log.String(), "runs without it") || !strings.Contains(d.Log.String(), c.why) {
				t.Fatalf("mps %q; log:\n%s\nwant mps off and the reason %q", s.MPS, d.Log, c.why)
			}
			l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
			if err != nil || l.Env["CUDA_MPS_PIPE_DIRECTORY"] != "" {
				t.Fatalf("lease %+v, %v: want one without MPS variables", l, err)
			}
			if n := len(controlDaemons(runDir)); n != 0 {
				t.Fatalf("%d control daemons run", n)
			}
			d.Stop()

			out, err := exec.Command(e2e.Bin("gpuletd"), "--backend", "sim", "--mps", "on", "--mps-control", c.control,
				"--socket", filepath.Join(dir, "on.sock"), "--run-dir", runDir, "--state-dir", filepath.Join(dir, "state"), "--mount", "").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "gpuletd: --mps=on") || !strings.Contains(string(out), c.why) {
				t.Fatalf("gpuletd --mps on: %v\n%s\nwant it to stop, saying %q", err, out, c.why)
			}
		})
	}
}

// TestOfflineClaimRefusedUnderMPSWhileDaemonIsDown: gpuletd stops and takes
// users.json with it, while MPS servers with clients stay up; a claim made
// then could land on an instance serving another user's job and wait there.
// So with MPS on, gpurun --offline refuses until gpuletd runs again.
func TestOfflineClaimRefusedUnderMPSWhileDaemonIsDown(t *testing.T) {
	d, runDir := startMPSDaemon(t)
	claim := func() (string, int) {
		return e2e.Output(t, exec.Command(e2e.Bin("gpurun"), "--offline", "--run-dir", runDir, "--", "true"))
	}
	if out, code := claim(); code != 0 {
		t.Fatalf("claim with gpuletd up: exit %d\n%s", code, out)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if out, code := claim(); code != 125 || !strings.Contains(out, "gpuletd is not running") || !strings.Contains(out, "MPS") {
		t.Fatalf("claim with gpuletd down: exit %d\n%s\nwant 125 saying gpuletd is not running", code, out)
	}
	d.Restart()
	testutil.Eventually(t, "claims once gpuletd runs again", func() bool {
		_, code := claim()
		return code == 0
	})
}
