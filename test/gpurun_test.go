package test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// gpurun runs the real gpurun against d with args, returning output and exit code.
func gpurun(t *testing.T, d *e2e.Daemon, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(e2e.Bin("gpurun"), args...)
	cmd.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket, "GPULET_RUN_DIR="+d.RunDir)
	return e2e.Output(t, cmd)
}

func TestGpurunExecsWithTheLeaseEnv(t *testing.T) {
	d := e2e.Start(t, "--units-per-client", "4", "--units-per-gpu", "16")
	// The command reports its pid and env, and exits with a status of its own.
	script := `echo pid=$$; echo lease=$GPULET_LEASE_ID; echo cvd=$CUDA_VISIBLE_DEVICES; echo pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; echo pipe=${CUDA_MPS_PIPE_DIRECTORY-unset}; echo keep=$KEEP_ME; exit 7`
	cmd := exec.Command(e2e.Bin("gpurun"), "--units", "2", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket, "KEEP_ME=yes", "CUDA_VISIBLE_DEVICES=stale", "CUDA_MPS_PIPE_DIRECTORY=/stale", "GPULET_LEASE_ID=l-parent")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v, want status 7; output %s", err, out)
	}
	vals := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		vals[k] = v
	}
	if vals["pid"] != strconv.Itoa(cmd.Process.Pid) {
		t.Fatalf("command ran as pid %s, gpurun was %d: not exec'd in place", vals["pid"], cmd.Process.Pid)
	}
	s, _ := d.Client.Snapshot(e2e.Ctx(t))
	uuids := map[string]bool{s.GPUs[0].UUID: true, s.GPUs[1].UUID: true}
	// 2 of 16 units: ceil(100·2/16) = 13 percent. MPS is off here, so the
	// caller's stale pipe folder must not reach the command.
	if !strings.HasPrefix(vals["lease"], "l-") || !uuids[vals["cvd"]] || vals["pct"] != "13" || vals["pipe"] != "unset" || vals["keep"] != "yes" {
		t.Fatalf("env seen by the command: %v", vals)
	}
	// The lease ends with the command, as soon as gpuletd sees it exit.
	testutil.Eventually(t, "the lease to end with the command", func() bool {
		_, err := d.Client.GetLease(e2e.Ctx(t), vals["lease"])
		return errors.Is(err, client.ErrNotFound)
	})
}

func TestGpurunLeaseIsBoundToTheCommand(t *testing.T) {
	d := e2e.Start(t)
	cmd := exec.Command(e2e.Bin("gpurun"), "--", "sleep", "300")
	cmd.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var lease api.Lease
	testutil.Eventually(t, "the lease of gpurun's pid", func() bool {
		ls, err := d.Client.Leases(e2e.Ctx(t))
		if err != nil || len(ls) != 1 {
			return false
		}
		lease = ls[0]
		return true
	})
	if lease.Owner.PID != cmd.Process.Pid {
		t.Fatalf("lease bound to pid %d, gpurun (now sleep) is %d", lease.Owner.PID, cmd.Process.Pid)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	testutil.Eventually(t, "units free after kill -9 of the command", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.UnitsFree == s.UnitsTotal
	})
}

func TestGpurunFailures(t *testing.T) {
	d := e2e.Start(t, "--units-per-client", "1")
	plain := filepath.Join(t.TempDir(), "plain-file")
	os.WriteFile(plain, []byte("not a program\n"), 0o644)
	garbage := filepath.Join(t.TempDir(), "garbage")
	os.WriteFile(garbage, []byte{0, 1, 2, 3}, 0o755)
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"not found", []string{"--", "no-such-command-xyz"}, 127, "no-such-command-xyz: command not found"},
		{"not executable", []string{"--", plain}, 126, "permission denied"},
		{"exec fails after the lease", []string{"--", garbage}, 126, "exec format error"},
		{"no command", []string{"--units", "1"}, 2, "no command given"},
		{"more than M", []string{"--units", "2", "--", "true"}, 125, "more than one process may hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := gpurun(t, d, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.msg) {
				t.Fatalf("exit %d, output %q; want %d containing %q", code, out, tc.code, tc.msg)
			}
		})
	}
	s, _ := d.Client.Snapshot(e2e.Ctx(t))
	if s.UnitsFree != s.UnitsTotal {
		t.Fatal("a failed gpurun left a lease")
	}
	// No daemon at all.
	cmd := exec.Command(e2e.Bin("gpurun"), "--socket", "/nonexistent/gpulet.sock", "--", "true")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 || !strings.Contains(string(out), "/nonexistent/gpulet.sock") || !strings.Contains(string(out), "--offline") {
		t.Fatalf("no daemon: %v %q", err, out)
	}
}

func TestGpurunNoUnitsAndWait(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "1")
	holder := exec.Command(e2e.Bin("gpurun"), "--", "sleep", "300")
	holder.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	testutil.Eventually(t, "the holder's lease", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.UnitsFree == 0
	})
	out, code := gpurun(t, d, "--", "true")
	if code != 125 || !strings.Contains(out, "asked for 1 unit") || !strings.Contains(out, "0 free") {
		t.Fatalf("no units: exit %d %q", code, out)
	}
	waiter := exec.Command(e2e.Bin("gpurun"), "--wait", "30s", "--", "sh", "-c", "echo got $GPULET_LEASE_ID")
	waiter.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	stderr, _ := waiter.StderrPipe()
	var stdout strings.Builder
	waiter.Stdout = &stdout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stderr).ReadString('\n')
	if !strings.Contains(line, "gpurun: waiting up to 30s for 1 unit(s)") || !strings.Contains(line, "0 of 1 units free on the node now") {
		t.Fatalf("waiting message %q", line)
	}
	holder.Process.Kill()
	holder.Wait()
	if err := waiter.Wait(); err != nil || !strings.HasPrefix(stdout.String(), "got l-") {
		t.Fatalf("waiter: %v, output %q", err, stdout.String())
	}
}

func TestGpurunInterruptedWaitLeavesNothing(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "1")
	holder, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	waiter := exec.Command(e2e.Bin("gpurun"), "--wait", "60s", "--", "true")
	waiter.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	stderr, _ := waiter.StderrPipe()
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	errs := bufio.NewReader(stderr)
	errs.ReadString('\n')
	waiter.Process.Signal(syscall.SIGINT)
	line, _ := errs.ReadString('\n')
	err = waiter.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(line, "nothing was leased") {
		t.Fatalf("interrupted waiter: %v, said %q", err, line)
	}
	ls, _ := d.Client.Leases(e2e.Ctx(t))
	if len(ls) != 1 {
		t.Fatalf("%d leases after the interrupted wait, want 1", len(ls))
	}
	// Nothing of the waiter is left: the unit that frees up now stays free.
	if err := d.Client.Release(e2e.Ctx(t), holder.ID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the unit free, with no lease", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.UnitsFree == 1
	})
	if ls, _ := d.Client.Leases(e2e.Ctx(t)); len(ls) != 0 {
		t.Fatalf("leases after the holder left: %+v", ls)
	}
}

// TestGpurunWaitKeepsAnIgnoredSIGINT: a waiting gpurun started with SIGINT
// ignored, as a shell starts its background jobs, goes on waiting through a
// SIGINT (Ctrl-C of the script), as its command would run on; SIGTERM still
// ends it.
func TestGpurunWaitKeepsAnIgnoredSIGINT(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "1")
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	waiter := exec.Command("sh", "-c", `trap "" INT; exec "$0" --wait 60s -- true`, e2e.Bin("gpurun"))
	waiter.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	stderr, _ := waiter.StderrPipe()
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	errs := bufio.NewReader(stderr)
	if line, _ := errs.ReadString('\n'); !strings.Contains(line, "waiting up to 1m0s") {
		t.Fatalf("waiting message %q", line)
	}
	exited := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, errs)
		exited <- waiter.Wait()
	}()
	waiter.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		t.Fatalf("an ignored SIGINT ended the wait: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	waiter.Process.Signal(syscall.SIGTERM)
	var ee *exec.ExitError
	if err := <-exited; !errors.As(err, &ee) || ee.ExitCode() != 143 {
		t.Fatalf("waiter after SIGTERM: %v, want exit 143", err)
	}
}

func TestGpurunOfflineWhileDaemonIsDown(t *testing.T) {
	d := e2e.Start(t)
	d.Stop()
	cmd := exec.Command(e2e.Bin("gpurun"), "--offline", "--gpu", "1", "--units", "2", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES $GPULET_LEASE_ID $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; exec sleep 300")
	cmd.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := readLine(t, out)
	d.Restart()
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil || s.GPUs[1].UnitsOffline != 2 || line != s.GPUs[1].UUID+" offline 13" {
		t.Fatalf("after restart: offline %d, command saw %q: %v", s.GPUs[1].UnitsOffline, line, err)
	}
	// The command dies: the claim is stale and freed.
	cmd.Process.Kill()
	cmd.Wait()
	testutil.Eventually(t, "the offline claim freed", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[1].UnitsOffline == 0
	})
	// No ledger at all: a clear error.
	bad := exec.Command(e2e.Bin("gpurun"), "--offline", "--run-dir", t.TempDir(), "--", "true")
	msg, err := bad.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 || !strings.Contains(string(msg), "no pipe-file ledger") {
		t.Fatalf("offline without a ledger: %v %q", err, msg)
	}
}

// TestGpurunOfflineCountedByARunningDaemon: a claim made beside a running
// gpuletd is counted at once, never leased, and freed when its command dies;
// a claim with no unit left fails clearly.
func TestGpurunOfflineCountedByARunningDaemon(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "2")
	holder := exec.Command(e2e.Bin("gpurun"), "--offline", "--", "sleep", "300")
	holder.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	testutil.Eventually(t, "the offline claim counted", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 1
	})
	out, code := gpurun(t, d, "--offline", "--units", "2", "--", "true")
	if code != 125 || !strings.Contains(out, "no instance has 2 unit(s) free; free now: GPU 0 (Tesla T4) 1 of 2") {
		t.Fatalf("offline claim beyond the free units: exit %d %q", code, out)
	}
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); !errors.Is(err, client.ErrInsufficientUnits) {
		t.Fatalf("the offline unit was leased: %v", err)
	}
	d.Client.Release(e2e.Ctx(t), l.ID)
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "the claim of a dead command freed", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0 && s.UnitsFree == s.UnitsTotal
	})
	if n := e2e.CountFIFOs(t, d.RunDir, l.GPU.UUID); n != 0 {
		t.Fatalf("%d FIFOs left", n)
	}
}
