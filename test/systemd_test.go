package test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestUnitFilesVerify runs systemd-analyze verify on the shipped unit files,
// with ExecStart pointed at the binary built for this run. Any complaint fails:
// verify exits 0 on some of them (an unknown KillMode, for one).
func TestUnitFilesVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed:", err)
	}
	dir := t.TempDir()
	for _, name := range []string{"gpuletd.service", "gpuletd.socket", "gpulet-collector.service"} {
		b, err := os.ReadFile(filepath.Join("..", "systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.ReplaceAll(string(b), "/usr/local/bin/gpulet-collector", e2e.Bin("gpulet-collector"))
		unit = strings.ReplaceAll(unit, "/usr/local/bin/gpuletd", e2e.Bin("gpuletd"))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(analyze, "verify", "--man=no", "./gpuletd.service", "./gpuletd.socket", "./gpulet-collector.service")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSocketActivationAndNotify runs gpuletd under systemd-socket-activate with
// a NOTIFY_SOCKET of the test's: the API answers on the passed socket, READY=1
// comes once it does, STOPPING=1 on SIGTERM.
func TestSocketActivationAndNotify(t *testing.T) {
	dir := t.TempDir()
	cmd, notify := startActivated(t, dir, nil, "--socket", filepath.Join(dir, "unused.sock"))
	// The socket file exists a moment before systemd-socket-activate listens
	// on it: wait for an answer, not for the file.
	c := &client.Client{Socket: filepath.Join(dir, "api.sock")}
	var s *api.Snapshot
	var err error
	testutil.Eventually(t, "gpuletd to answer on the activation socket", func() bool {
		s, err = c.Snapshot(e2e.Ctx(t))
		return err == nil
	})
	if s.Backend != "simulated" {
		t.Fatalf("snapshot over the activated socket: %+v %v", s, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused.sock")); err == nil {
		t.Fatal("gpuletd made its own socket although systemd passed one")
	}
	waitNotify(t, notify, "READY=1", 15*time.Second)
	cmd.Process.Signal(syscall.SIGTERM)
	waitNotify(t, notify, "STOPPING=1", 15*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// TestSystemdWatchdogOutpacesSampleInterval: the watchdog is pinged within
// systemd's WatchdogSec (WATCHDOG_USEC) however long --sample-interval is;
// pinged only at each sample, a gpuletd sampling every minute was killed by
// the unit's 30 s watchdog again and again.
func TestSystemdWatchdogOutpacesSampleInterval(t *testing.T) {
	dir := t.TempDir()
	_, notify := startActivated(t, dir, []string{"WATCHDOG_USEC=2000000"}, "--sample-interval", "1h")
	// systemd-socket-activate starts gpuletd at the first connection.
	c := &client.Client{Socket: filepath.Join(dir, "api.sock")}
	testutil.Eventually(t, "gpuletd to answer on the activation socket", func() bool {
		_, err := c.Snapshot(e2e.Ctx(t))
		return err == nil
	})
	waitNotify(t, notify, "READY=1", 15*time.Second)
	for range 2 {
		waitNotify(t, notify, "WATCHDOG=1", 2*time.Second)
	}
}

// startActivated runs gpuletd (simulated, no MPS, no view, run and state
// dirs under dir) with flags under systemd-socket-activate on dir/api.sock,
// with a notify socket of the test's and env (NAME=VALUE) besides; skipped
// without the tool. It is killed at the end, its log shown if the test
// failed.
func startActivated(t *testing.T, dir string, env []string, flags ...string) (*exec.Cmd, *net.UnixConn) {
	t.Helper()
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate is not installed:", err)
	}
	notify := listenNotify(t)
	args := []string{"-l", filepath.Join(dir, "api.sock"), "-E", "NOTIFY_SOCKET=" + notify.LocalAddr().String()}
	for _, e := range env {
		args = append(args, "-E", e)
	}
	args = append(args, e2e.Bin("gpuletd"), "--backend", "sim", "--mps", "off", "--mount", "",
		"--run-dir", filepath.Join(dir, "run"), "--state-dir", filepath.Join(dir, "state"))
	cmd := exec.Command(activate, append(args, flags...)...)
	log := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	})
	return cmd, notify
}

// waitNotify reads notification datagrams until one holds want, for at most
// within.
func waitNotify(t *testing.T, c *net.UnixConn, want string, within time.Duration) {
	t.Helper()
	buf := make([]byte, 4096)
	deadline := time.Now().Add(within)
	for {
		c.SetReadDeadline(deadline)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v", want, err)
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if line == want {
				return
			}
		}
	}
}

// TestMakeInstall installs into a temporary root with make install and checks
// what an admin gets: the binaries, taken from bin/ without building when it
// is up to date, Slurm's hook links, unit files that systemd-analyze verify
// accepts with ExecStart at the installed gpuletd, and a sysusers.d entry
// that makes the socket's group.
func TestMakeInstall(t *testing.T) {
	for _, tool := range []string{"make", "systemd-analyze", "systemd-sysusers"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	root := t.TempDir()
	prefix := filepath.Join(root, "usr", "local")
	// The harness's binaries stand in for make's build, which they are.
	bin := t.TempDir()
	for _, name := range []string{"gpuletd", "gpurun", "gpulet", "gpulet-collector", "gpulet-replay"} {
		if err := os.Symlink(e2e.Bin(name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	// bin/ is newer than every source: make install takes it as it is,
	// without Go (GO=false fails any build), as root without Go on PATH.
	cmd := exec.Command("make", "-s", "install", "PREFIX="+prefix, "BIN="+bin, "GO=false")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, hook := range []string{"gpulet-slurm-task-prolog", "gpulet-slurm-task-prolog-batch", "gpulet-slurm-epilog"} {
		if to, err := os.Readlink(filepath.Join(prefix, "lib", "gpulet", hook)); err != nil || to != filepath.Join(prefix, "bin", "gpulet") {
			t.Errorf("Slurm hook %s links to %q (%v), want the installed gpulet", hook, to, err)
		}
	}
	units := filepath.Join(prefix, "lib", "systemd", "system")
	for _, f := range []string{"bin/gpuletd", "bin/gpurun", "bin/gpulet", "bin/gpulet-collector", "bin/gpulet-replay", "lib/systemd/system/gpulet-collector.service", "lib/systemd/system/gpuletd.service", "lib/systemd/system/gpuletd.socket", "lib/sysusers.d/gpulet.conf"} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Errorf("make install left out %s: %v", f, err)
		}
	}
	service, _ := os.ReadFile(filepath.Join(units, "gpuletd.service"))
	if !strings.Contains(string(service), "ExecStart="+filepath.Join(prefix, "bin", "gpuletd")+"\n") {
		t.Fatalf("installed unit does not start the installed gpuletd:\n%s", service)
	}
	if collector, _ := os.ReadFile(filepath.Join(units, "gpulet-collector.service")); !strings.Contains(string(collector), "ExecStart="+filepath.Join(prefix, "bin", "gpulet-collector")+" ") {
		t.Fatalf("installed collector unit does not start the installed gpulet-collector:\n%s", collector)
	}
	verify := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(units, "gpuletd.service"), filepath.Join(units, "gpuletd.socket"), filepath.Join(units, "gpulet-collector.service"))
	if out, err := verify.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify of the installed units: %v\n%s", err, out)
	}
	etc := filepath.Join(t.TempDir(), "etc")
	os.MkdirAll(etc, 0o755)
	for _, f := range []string{"passwd", "group"} {
		b, _ := os.ReadFile(filepath.Join("/etc", f))
		b = []byte(strings.Join(slices.DeleteFunc(strings.Split(string(b), "\n"), func(l string) bool { return strings.HasPrefix(l, "gpulet:") }), "\n"))
		os.WriteFile(filepath.Join(etc, f), b, 0o644)
	}
	// A bin/ older than the sources is built again, which needs Go.
	stale := t.TempDir()
	for _, name := range []string{"gpuletd", "gpurun", "gpulet", "gpulet-collector", "gpulet-replay"} {
		p := filepath.Join(stale, name)
		if err := copyFile(e2e.Bin(name), p); err != nil {
			t.Fatal(err)
		}
		old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
		os.Chtimes(p, old, old)
	}
	cmd = exec.Command("make", "-s", "install", "PREFIX="+filepath.Join(root, "stale"), "BIN="+stale, "GO=/nonexistent/go")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "make install: "+stale+"/ is older than the sources and /nonexistent/go is not on PATH: run make build as yourself first") {
		t.Fatalf("make install of a stale bin/ without Go: %v\n%s", err, out)
	}
	users := exec.Command("systemd-sysusers", "--dry-run", "--root="+filepath.Dir(etc), filepath.Join(prefix, "lib", "sysusers.d", "gpulet.conf"))
	if out, err := users.CombinedOutput(); err != nil || !strings.Contains(string(out), "Creating group 'gpulet'") {
		t.Fatalf("systemd-sysusers --dry-run: %v\n%s", err, out)
	}
}
