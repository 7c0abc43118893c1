package test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// gpulet runs the real gpulet against d, returning its output and exit code.
func gpulet(t *testing.T, d *e2e.Daemon, args ...string) (string, int) {
	t.Helper()
	return e2e.Output(t, exec.Command(e2e.Bin("gpulet"), append([]string{"--socket", d.Socket}, args...)...))
}

func TestGpuletCommands(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xA100-80GB,1xT4")
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, GPU: "1", TTL: "5m", Task: "train"})
	if err != nil {
		t.Fatal(err)
	}
	// An offline claim shows in the bar as 'o'.
	claim := exec.Command(e2e.Bin("gpurun"), "--offline", "--gpu", "1", "--", "sleep", "300")
	claim.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	if err := claim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { claim.Process.Kill(); claim.Wait() }()
	testutil.Eventually(t, "the offline claim counted", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[1].UnitsOffline == 1
	})
	out, code := gpulet(t, d, "status")
	for _, want := range []string{"backend: simulated", "NVIDIA A100-SXM4-80GB", "Tesla T4", "[................]", "[#o..............]", "1/1/0/14", "total: 32 units, 30 free"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	out, code = gpulet(t, d, "status", "--json")
	var s api.Snapshot
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s.Schema != api.SnapshotSchema || s.UnitsFree != 30 || s.GPUs[1].UnitsOffline != 1 {
		t.Fatalf("status --json (exit %d): %s", code, out)
	}
	out, code = gpulet(t, d, "leases")
	if code != 0 || !strings.Contains(out, l.ID) || !strings.Contains(out, "train") {
		t.Fatalf("leases (exit %d):\n%s", code, out)
	}
	out, code = gpulet(t, d, "leases", "--all", "--json")
	var ll api.LeaseList
	if code != 0 || json.Unmarshal([]byte(out), &ll) != nil || len(ll.Leases) != 1 || ll.Leases[0].ID != l.ID {
		t.Fatalf("leases --all --json (exit %d): %s", code, out)
	}
	out, code = gpulet(t, d, "release", "l-0000000000000000")
	if code != 1 || out != "gpulet: not_found: no lease \"l-0000000000000000\"\n" {
		t.Fatalf("release of a missing lease (exit %d): %q", code, out)
	}
	if out, code = gpulet(t, d, "release", l.ID); code != 0 || out != "released "+l.ID+"\n" {
		t.Fatalf("release (exit %d): %s", code, out)
	}
	if out, _ = gpulet(t, d, "leases"); !strings.Contains(out, "no leases") {
		t.Fatalf("leases after release:\n%s", out)
	}
	if out, code = gpulet(t, d, "drain"); code != 0 || !strings.Contains(out, "node e2e is draining") {
		t.Fatalf("drain (exit %d): %s", code, out)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("lease on a draining node: %v", err)
	}
	if out, _ := gpulet(t, d, "status"); !strings.Contains(out, "state: draining") {
		t.Fatalf("status while draining:\n%s", out)
	}
	// gpurun says what the daemon said, as one line with its code.
	if out, code := gpurun(t, d, "--", "true"); code != 125 || !strings.Contains(out, "gpurun: unavailable: the node is draining") {
		t.Fatalf("gpurun on a draining node: exit %d %q", code, out)
	}
	if out, code = gpulet(t, d, "undrain"); code != 0 || !strings.Contains(out, "node e2e is working") {
		t.Fatalf("undrain (exit %d): %s", code, out)
	}
}

func TestGpuletUsageAndNoDaemon(t *testing.T) {
	d := e2e.Start(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `gpulet: unknown command "frobnicate"`},
		{nil, 2, "Commands:"},
		{[]string{"help"}, 0, "Commands:"},
		{[]string{"top", "--help"}, 0, "--interval"},
		{[]string{"release"}, 2, "wrong number of arguments"},
	} {
		if out, code := gpulet(t, d, tc.args...); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("gpulet %q: exit %d, output %q; want %d containing %q", tc.args, code, out, tc.code, tc.want)
		}
	}
	cmd := exec.Command(e2e.Bin("gpulet"), "status")
	cmd.Env = append(os.Environ(), "GPULET_SOCKET=/nonexistent/gpulet.sock")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), "gpulet: cannot reach gpuletd at /nonexistent/gpulet.sock: is it running?") {
		t.Fatalf("no daemon: %v %q", err, out)
	}
}

func TestGpuletTopUntilCtrlC(t *testing.T) {
	d := e2e.Start(t)
	cmd := exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "top", "--interval", "100ms")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Two frames show that it refreshes.
	frames := 0
	for sc := bufio.NewScanner(stdout); frames < 2 && sc.Scan(); {
		if strings.Contains(sc.Text(), "backend: simulated") {
			frames++
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil || frames < 2 {
		t.Fatalf("top after Ctrl-C: %v, %d frames", err, frames)
	}
}
