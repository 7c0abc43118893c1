package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestSocketGroupMessages: a user outside the socket's group is told the
// group and the command that adds them, by gpurun and gpulet alike, and not
// to start a gpuletd that runs nor to claim offline, which needs the same
// group; a user whom the database lists in the group, in a login that began
// before, is told to log in again.
func TestSocketGroupMessages(t *testing.T) {
	needUserTools(t)
	sockGroup := addGroup(t)
	d := startForUsers(t, sockGroup)
	outsider := addUser(t)
	advice := fmt.Sprintf("cannot reach gpuletd at %s: permission denied: your user must be in the socket's group, %s: sudo usermod -aG %s $USER, then log in again (gpuletd not reachable)\n", d.Socket, sockGroup, sockGroup)
	out, code := asUser(t, d, outsider, "gpurun", "--", "true")
	if code != 125 || out != "gpurun: "+advice {
		t.Errorf("gpurun outside the group: exit %d\n%q\nwant\n%q", code, out, "gpurun: "+advice)
	}
	out, code = asUser(t, d, outsider, "gpulet", "status")
	if code != 1 || out != "gpulet: "+advice {
		t.Errorf("gpulet status outside the group: exit %d\n%q\nwant\n%q", code, out, "gpulet: "+advice)
	}

	// Listed in the group since, but this process runs with the groups of
	// before.
	late := addUser(t)
	if out, err := exec.Command("usermod", "-aG", sockGroup, late.name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v\n%s", err, out)
	}
	out, code = asUser(t, d, late, "gpulet", "status")
	want := fmt.Sprintf("permission denied: you are in group %s now, but this login started before: log in again (or run newgrp %s)", sockGroup, sockGroup)
	if code != 1 || !strings.Contains(out, want) {
		t.Errorf("gpulet status before a new login: exit %d\n%s\nwant %q", code, out, want)
	}
}

// TestNoDaemonNamesThePrivateSocket: with no gpuletd at the default socket and
// none chosen, gpurun and gpulet name the socket of the private gpuletd that
// make run starts, with the export line that reaches it.
func TestNoDaemonNamesThePrivateSocket(t *testing.T) {
	if _, err := os.Stat("/run/gpulet/gpulet.sock"); err == nil {
		t.Skip("a gpuletd socket is at the default path on this host")
	}
	// A socket where make run puts a private gpuletd's stands for one.
	xdg := shortTemp(t, "gnd")
	sock := filepath.Join(xdg, "gpulet", "gpulet.sock")
	if err := os.Mkdir(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	env := []string{"PATH=" + os.Getenv("PATH"), "XDG_RUNTIME_DIR=" + xdg}
	hint := "  a private gpuletd (make run's) has its socket at " + sock + ": export GPULET_SOCKET=" + sock + "\n"
	for _, c := range [][]string{{"gpurun", "--", "true"}, {"gpulet", "status"}} {
		cmd := exec.Command(e2e.Bin(c[0]), c[1:]...)
		cmd.Env = env
		out, code := e2e.Output(t, cmd)
		if code == 0 || !strings.HasSuffix(out, hint) || !strings.Contains(out, "cannot reach gpuletd at /run/gpulet/gpulet.sock") {
			t.Errorf("%s: exit %d\n%s\nwant it to end with %q", c[0], code, out, hint)
		}
	}
}

// TestSocketPathLimit: a socket path over 107 bytes is refused up front by
// gpuletd and the clients, naming the limit.
func TestSocketPathLimit(t *testing.T) {
	long := "/tmp/" + strings.Repeat("s", 100) + "/gpulet.sock"
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpuletd"), "--socket", long, "--backend", "sim"))
	if want := fmt.Sprintf("gpuletd: --socket %s is %d bytes, and a Unix socket path holds at most 107: choose a shorter one\n", long, len(long)); code != 2 || !strings.HasSuffix(out, want) {
		t.Errorf("gpuletd: exit %d\n%q\nwant %q", code, out, want)
	}
	want := fmt.Sprintf("cannot reach gpuletd: socket path too long: %s is %d bytes, and a Unix socket path holds at most 107: choose a shorter one (gpuletd not reachable)\n", long, len(long))
	for _, c := range [][]string{{"gpurun", "--socket", long, "--", "true"}, {"gpulet", "--socket", long, "status"}} {
		out, code := e2e.Output(t, exec.Command(e2e.Bin(c[0]), c[1:]...))
		if code == 0 || out != c[0]+": "+want {
			t.Errorf("%s: exit %d\n%q\nwant %q", c[0], code, out, c[0]+": "+want)
		}
	}
}

// TestMakeRunRefusals: make run refuses, before its banner, a run dir whose
// socket path no Unix socket can have and a run dir another gpuletd uses
// (naming its pid); a private instance beside the system's gpuletd or NVIDIA
// devices runs the simulated backend without MPS, and says why; make clean
// refuses while a gpuletd uses the clone's state dir.
func TestMakeRunRefusals(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("make run as root with RUN_DIR stands for a private instance; runs as", os.Getuid())
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed:", err)
	}
	clone := makeClone(t, nil)
	long := filepath.Join(t.TempDir(), strings.Repeat("r", 100))
	out, code := e2e.Output(t, userCmd(nil, clone, os.Environ(), "make", "run", "NO_BUILD=1", "RUN_DIR="+long))
	if code == 0 || !strings.Contains(out, "a Unix socket path holds at most 107: choose a shorter run dir") || strings.Contains(out, "gpuletd starts") {
		t.Fatalf("make run with a long RUN_DIR: exit %d\n%s", code, out)
	}

	// The system's gpuletd, as the admin runs it, and devices like a GPU's.
	system := e2e.Start(t)
	dev := t.TempDir()
	if err := os.WriteFile(filepath.Join(dev, "nvidia0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GPULET_SYSTEM_RUN_DIR="+system.RunDir, "GPULET_DEV_DIR="+dev)
	runDir := shortTemp(t, "gmb")
	r := startMakeRun(t, clone, nil, env, "RUN_DIR="+runDir)
	want := fmt.Sprintf("  backend    sim, MPS off: this host has NVIDIA GPUs; gpuletd pid %d runs here with run dir %s (RUN_FLAGS='--backend nvml --mps auto' drives the GPUs instead)\n", system.Pid(), system.RunDir)
	if !strings.Contains(r.out.String(), want) {
		t.Errorf("make run beside GPUs and gpuletd: banner lacks %q\n%s", want, r.out)
	}
	r.check(t, filepath.Join(runDir, "gpulet.sock"), false)

	// make run again with the same run dir names the gpuletd that uses it.
	out, code = e2e.Output(t, userCmd(nil, clone, env, "make", "run", "NO_BUILD=1", "RUN_DIR="+runDir))
	m := regexp.MustCompile(`make run: gpuletd \(pid (\d+)\) already runs with run dir ` + regexp.QuoteMeta(runDir) + `: stop it first \(kill (\d+)\)`).FindStringSubmatch(out)
	if code == 0 || m == nil || m[1] != m[2] || strings.Contains(out, "gpuletd starts") {
		t.Fatalf("make run twice: exit %d\n%s", code, out)
	}
	if comm, err := os.ReadFile("/proc/" + m[1] + "/comm"); err != nil || string(comm) != "gpuletd\n" {
		t.Errorf("pid %s is %q (%v), not gpuletd", m[1], comm, err)
	}

	// make clean from a shell whose XDG_RUNTIME_DIR differs leaves the state
	// dir (and bin/) of a gpuletd that runs alone.
	other := append(env, "XDG_RUNTIME_DIR=/nonexistent")
	out, code = e2e.Output(t, userCmd(nil, clone, other, "make", "clean"))
	if want := fmt.Sprintf("make clean: gpuletd (pid %s) still runs with state dir %s/.run/state: stop it first", m[1], clone); code == 0 || !strings.Contains(out, want) {
		t.Errorf("make clean under a running gpuletd: exit %d\n%s\nwant %q", code, out, want)
	}
	if _, err := os.Stat(filepath.Join(clone, "bin", "gpuletd")); err != nil {
		t.Errorf("make clean removed bin/ under a running gpuletd: %v", err)
	}
	r.stop(t)
}

// TestStopWhileWaiting: a gpurun that waits for units when gpuletd stops is
// told that gpuletd stopped, not that a request was cancelled.
func TestStopWhileWaiting(t *testing.T) {
	d := e2e.Start(t)
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{GPUs: 2, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e2e.Bin("gpurun"), "--socket", d.Socket, "--wait", "1m", "--", "true")
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "gpurun to wait", func() bool { return strings.Contains(stderr.String(), "waiting up to 1m0s") })
	// gpurun says it waits before it sends the request, and nothing gpuletd
	// shows counts waiting requests: a request still unread when gpuletd
	// stops finds its connection closed instead ("cannot reach gpuletd").
	// Give the request time to be read.
	time.Sleep(time.Second)
	d.Stop()
	err := cmd.Wait()
	want := "gpurun: unavailable: gpuletd stopped while the request waited for units: nothing was leased; ask again once it is back\n"
	if err == nil || !strings.HasSuffix(stderr.String(), want) {
		t.Fatalf("gpurun: %v\n%s\nwant it to end with %q", err, stderr.String(), want)
	}
}

// TestStatusMarksUnitsNotForYou: while alice's job holds GPU 0's only MPS
// instance, bob's gpulet status names its free units as not his, and why.
func TestStatusMarksUnitsNotForYou(t *testing.T) {
	needUserTools(t)
	sockGroup := addGroup(t)
	alice, bob := addUser(t, sockGroup), addUser(t, sockGroup)
	d, _ := startMPSDaemon(t, "--socket-group", sockGroup)
	os.Chmod(filepath.Dir(d.Dir), 0o755)
	os.Chmod(d.Dir, 0o755)
	job := alice.command(copyForOthers(t, e2e.Bin("gpurun")), "--socket", d.Socket, "--gpu", "0", "--", "sleep", "60")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Process.Kill(); job.Wait() })
	testutil.Eventually(t, "alice's lease on GPU 0", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && len(s.GPUs[0].Instances) > 0 && s.GPUs[0].Instances[0].UID != nil
	})
	out, code := asUser(t, d, bob, "gpulet", "status")
	want := fmt.Sprintf("free, but not for you:\n  GPU 0 instance 0: its 15 free unit(s) are not yours now: its MPS server serves %s, and an MPS server serves one user at a time\n", alice.name)
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("bob's gpulet status: exit %d\n%s\nwant %q", code, out, want)
	}
	if out, _ := asUser(t, d, alice, "gpulet", "status"); strings.Contains(out, "not for you") {
		t.Fatalf("alice's own instance is marked not hers:\n%s", out)
	}
}

// TestMakeCleanLeavesMPSDaemonsWithClients: an MPS control daemon that
// gpuletd left running for a job's clients (Ctrl-C on make run with a lease
// held) goes once told to quit and its clients end; until then make clean
// says so and leaves the run dir, whose pipe folders the daemon still
// serves, and removes it once the daemon is gone. A script stands for the
// daemon whose clients still run: it ignores quit.
func TestMakeCleanLeavesMPSDaemonsWithClients(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("make clean's run dir here is root's /tmp/gpulet-0 or XDG one; runs as", os.Getuid())
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed:", err)
	}
	clone := makeClone(t, nil)
	xdg := shortTemp(t, "gxc")
	runDir := filepath.Join(xdg, "gpulet")
	pipe := filepath.Join(runDir, "mps", "GPU-00000000-0000-0000-0000-000000000000", "0", "pipe")
	if err := os.MkdirAll(pipe, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(runDir, 0o700)
	os.Mkdir(filepath.Join(clone, ".run"), 0o755)
	if err := os.WriteFile(filepath.Join(clone, ".run", "run-dir"), []byte(runDir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := t.TempDir()
	control := filepath.Join(fake, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte("#!/bin/sh\nif [ \"$1\" = -d ]; then sleep 300; fi\ncat >/dev/null\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(control, "-d")
	daemon.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipe)
	daemon.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { syscall.Kill(-daemon.Process.Pid, syscall.SIGKILL); daemon.Wait() }
	t.Cleanup(stop)
	env := append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "XDG_RUNTIME_DIR="+xdg)

	out, code := e2e.Output(t, userCmd(nil, clone, env, "make", "clean"))
	want := fmt.Sprintf("make clean: the MPS control daemon(s) %d of %s still serve clients, told to quit once they end: %s is left; make clean again after", daemon.Process.Pid, runDir, runDir)
	if code == 0 || !strings.Contains(out, want) {
		t.Fatalf("make clean with a daemon serving clients: exit %d\n%s\nwant %q", code, out, want)
	}
	if _, err := os.Stat(pipe); err != nil {
		t.Fatalf("make clean removed the pipe folder a daemon still serves: %v", err)
	}
	stop()
	if out, code := e2e.Output(t, userCmd(nil, clone, env, "make", "clean")); code != 0 || !strings.Contains(out, "removed "+runDir) {
		t.Fatalf("make clean once the daemon is gone: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(runDir); !os.IsNotExist(err) {
		t.Fatalf("run dir still there: %v", err)
	}
}
