package test

import (
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestXidFailsGPUUntilAnAdminClearsIt injects a critical Xid on a simulated GPU:
// the GPU is failed and takes no leases, good samples do not bring it back, a
// user cannot clear it, root can with gpulet undrain --gpu, and so does a
// restart.
func TestXidFailsGPUUntilAnAdminClearsIt(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the simulated GPU control is root's, and the test runs a client as a user it creates; runs as", os.Getuid())
	}
	group := e2e.NewGroup(t)
	u := e2e.NewUser(t, group)
	notify := listenNotify(t)
	d := e2e.Start(t, "--socket-group", group.Name)
	// t.TempDir folders are private to root; let the user reach the socket.
	os.Chmod(filepath.Dir(d.Dir), 0o755)
	os.Chmod(d.Dir, 0o755)
	ctx := e2e.Ctx(t)

	xid := uint64(79)
	g, err := d.Client.SetSimGPU(ctx, 0, api.SimGPUUpdate{Xid: &xid})
	if err != nil || g.State != api.GPUFailed || g.Eligible || g.Xid != 79 {
		t.Fatalf("after Xid 79: %+v %v", g, err)
	}
	checkGPU0 := func(state string, eligible bool, xid uint64) {
		t.Helper()
		s, err := d.Client.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g := s.GPUs[0]
		if g.State != state || g.Eligible != eligible || g.Xid != xid {
			t.Fatalf("GPU 0 is %s, eligible %v, xid %d; want %s, %v, %d (%+v)", g.State, g.Eligible, g.Xid, state, eligible, xid, g)
		}
		if xid != 0 && g.Error != "Xid 79: GPU has fallen off the bus" {
			t.Fatalf("GPU 0 error %q", g.Error)
		}
		if s.GPUs[1].State != api.GPUWorking || !s.GPUs[1].Eligible {
			t.Fatalf("GPU 1 %+v, want working and eligible", s.GPUs[1])
		}
	}
	checkGPU0(api.GPUFailed, false, 79)
	testutil.Eventually(t, "the Xid's log line", func() bool {
		return strings.Contains(d.Log.String(), "critical Xid event (simulated)") && strings.Contains(d.Log.String(), "xid=79")
	})

	// A lease asking for GPU 0 fails with a 409 that says why.
	resp, err := d.HTTP().Post("http://gpulet/v1/leases", "application/json", strings.NewReader(`{"units":1,"gpu":"0","ttl":"1m"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "GPU 0 failed: Xid 79: GPU has fallen off the bus") {
		t.Fatalf("lease on GPU 0: %d %s", resp.StatusCode, body)
	}
	// Other leases go to GPU 1.
	for i := 0; i < 3; i++ {
		l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"})
		if err != nil || l.GPU.Index != 1 {
			t.Fatalf("lease %d: %+v %v, want GPU 1", i, l, err)
		}
	}
	// Good samples (every 100ms here) do not clear it: five watchdog pings
	// are at least four whole sample ticks.
	waitWatchdog(t, notify, 5)
	checkGPU0(api.GPUFailed, false, 79)

	// A user cannot clear it, by the command or the API.
	out, code := e2e.Output(t, u.Command(exec.Command(copyForOthers(t, e2e.Bin("gpulet")), "--socket", d.Socket, "undrain", "--gpu", "0")))
	if code != 1 || !strings.Contains(out, "gpulet: forbidden: ") {
		t.Fatalf("gpulet undrain --gpu 0 as a user: exit %d\n%s", code, out)
	}
	checkGPU0(api.GPUFailed, false, 79)

	// Root can; the node's draining is not touched.
	out, code = gpulet(t, d, "undrain", "--gpu", "0")
	if code != 0 || !strings.Contains(out, "GPU 0 (") || !strings.Contains(out, "no Xid fault now; state working, eligible yes") {
		t.Fatalf("gpulet undrain --gpu 0 as root: exit %d\n%s", code, out)
	}
	checkGPU0(api.GPUWorking, true, 0)
	l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, GPU: "0", TTL: "1m"})
	if err != nil || l.GPU.Index != 0 {
		t.Fatalf("lease on GPU 0 after clearing: %+v %v", l, err)
	}
	if !strings.Contains(d.Log.String(), "Xid fault cleared by an admin") {
		t.Errorf("no log line for the clearing:\n%s", d.Log.String())
	}
	// An application Xid leaves the GPU in service.
	app := uint64(13)
	if g, err := d.Client.SetSimGPU(ctx, 0, api.SimGPUUpdate{Xid: &app}); err != nil || g.State != api.GPUWorking || g.Xid != 0 {
		t.Fatalf("after Xid 13: %+v %v", g, err)
	}

	// A restart clears it too.
	if _, err := d.Client.SetSimGPU(ctx, 0, api.SimGPUUpdate{Xid: &xid}); err != nil {
		t.Fatal(err)
	}
	checkGPU0(api.GPUFailed, false, 79)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	checkGPU0(api.GPUWorking, true, 0)
	if _, err := d.Client.UndrainGPU(ctx, "7"); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("undrain of GPU 7 on a node of two: %v", err)
	}
}
