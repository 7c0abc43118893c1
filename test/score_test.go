package test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestScorePolicyAndMinCC runs the worked example of docs/placement.md on the
// real daemon: a T4 and an A100-80GB under --policy score, loaded as the page
// says, place requests A, B and C where the page says; min_cc 9.0 fails at
// once even with a wait; a busy A100 sends a plain request to the T4 and
// makes a min_cc 8.0 one (gpurun --min-cc) wait for it.
func TestScorePolicyAndMinCC(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the simulated GPU controls that set the example's memory and utilization are root's; runs as", os.Getuid())
	}
	d := e2e.Start(t, "--sim-gpus", "1xT4-16GB,1xA100-80GB", "--policy", "score", "--units-per-client", "4", "--units-per-gpu", "16")
	ctx := e2e.Ctx(t)

	// What each card is, where users look.
	gl, err := d.Client.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []api.Capability{
		{ComputeCapability: "7.5", Cores: 2560, MaxSMClockMHz: 1590, MemoryBusWidthBit: 256, MemoryClockMHz: 5001, MemoryBandwidthGBps: 320},
		{ComputeCapability: "8.0", Cores: 6912, MaxSMClockMHz: 1410, MemoryBusWidthBit: 5120, MemoryClockMHz: 1593, MemoryBandwidthGBps: 2039},
	} {
		if got := gl.GPUs[i].Capability; got != want {
			t.Fatalf("GPU %d capability %+v, want %+v", i, got, want)
		}
	}
	out, code := gpulet(t, d, "gpus")
	if code != 0 || !strings.Contains(out, "Tesla T4               7.5  15360         320               1590") ||
		!strings.Contains(out, "NVIDIA A100-SXM4-80GB  8.0  81920         2039              1410") {
		t.Fatalf("gpulet gpus: exit %d\n%s", code, out)
	}

	// The example's node: 12 small jobs on the T4 that asked 100 MiB each and
	// use 1,360 MiB in all, one lease of 4 units on the A100 that uses 70,000
	// MiB.
	for i := 0; i < 12; i++ {
		if _, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, GPU: "0", MemoryMiB: 100, TTL: "5m"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 4, GPU: "1", MemoryMiB: 70000, TTL: "5m"}); err != nil {
		t.Fatal(err)
	}
	setSim(t, d, 0, api.SimGPUUpdate{MemoryUsedMiB: ptr(uint64(1360))})
	setSim(t, d, 1, api.SimGPUUpdate{MemoryUsedMiB: ptr(uint64(70000))})

	// Requests A, B and C go where the page's arithmetic says.
	for _, tc := range []struct {
		name string
		req  api.LeaseRequest
		gpu  int
	}{
		{"A: memory-heavy, to the T4 whose free memory has its shape", api.LeaseRequest{Units: 1, MemoryMiB: 10000}, 0},
		{"B: units' share of memory, to the stronger A100", api.LeaseRequest{Units: 1}, 1},
		{"C: A with min_cc 8.0, to the A100", api.LeaseRequest{Units: 1, MemoryMiB: 10000, MinCC: "8.0"}, 1},
	} {
		tc.req.TTL = "1m"
		l, err := d.Client.Lease(ctx, tc.req)
		if err != nil || l.GPU.Index != tc.gpu {
			t.Fatalf("%s: placed on %+v, %v; want GPU %d", tc.name, l, err, tc.gpu)
		}
		if err := d.Client.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}

	// min_cc 9.0: no card here reaches it; the answer comes at once, wait
	// or not, and says why for each GPU.
	start := time.Now()
	status, body := postLease(t, d, `{"units":1,"ttl":"1m","min_cc":"9.0","wait":"30s"}`)
	if status != http.StatusConflict || body.Error.Code != api.CodeInsufficientUnits || !strings.Contains(body.Error.Message, api.NeverFits) ||
		!strings.Contains(body.Error.Message, "GPU 0 has compute capability 7.5, below the 9.0 asked; GPU 1 has compute capability 8.0, below the 9.0 asked") {
		t.Fatalf("min_cc 9.0: %d %+v", status, body)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("min_cc 9.0 answered after %s: it waited", waited)
	}
	// A min_cc that is not MAJOR.MINOR is refused, naming the field.
	status, body = postLease(t, d, `{"units":1,"ttl":"1m","min_cc":"8"}`)
	if status != http.StatusBadRequest || !strings.HasPrefix(body.Error.Message, `min_cc: "8" is not a compute capability MAJOR.MINOR`) {
		t.Fatalf("min_cc 8: %d %+v", status, body)
	}
	out, code = gpurun(t, d, "--min-cc", "9.0", "--wait", "30s", "--", "true")
	if code != 125 || !strings.Contains(out, "of compute capability 9.0 or above") || !strings.Contains(out, api.NeverFits) {
		t.Fatalf("gpurun --min-cc 9.0: exit %d\n%s", code, out)
	}

	// A busy A100 takes nothing: a plain request goes to the T4, ...
	setSim(t, d, 1, api.SimGPUUpdate{UtilizationPct: ptr(95)})
	l, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil || l.GPU.Index != 0 {
		t.Fatalf("with the A100 busy: %+v %v, want GPU 0", l, err)
	}
	d.Client.Release(ctx, l.ID)
	// ... one with min_cc 8.0 fails without a wait, naming both reasons, ...
	_, err = d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m", MinCC: "8.0"})
	if !errors.Is(err, client.ErrInsufficientUnits) || strings.Contains(err.Error(), api.NeverFits) ||
		!strings.Contains(err.Error(), "GPU 0 has compute capability 7.5, below the 8.0 asked; GPU 1 has 95% of its SMs busy") {
		t.Fatalf("min_cc 8.0 with the A100 busy: %v", err)
	}
	// ... and with a wait (gpurun --min-cc 8.0 --wait) waits for the A100.
	waiter, stdout, line := startWaiting(t, d, "--min-cc", "8.0", "--wait", "30s", "--", "sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES")
	if !strings.Contains(line, "waiting up to 30s for 1 unit(s) of compute capability 8.0 or above") ||
		!strings.Contains(line, "(GPU 1 NVIDIA A100-SXM4-80GB: 12 free, not eligible (working, 95% busy))") {
		t.Fatalf("gpurun's waiting message %q", line)
	}
	setSim(t, d, 1, api.SimGPUUpdate{UtilizationPct: ptr(0)})
	if err := waiter.Wait(); err != nil || strings.TrimSpace(stdout.String()) != "cvd="+gl.GPUs[1].UUID {
		t.Fatalf("the waiter: %v, output %q; want it on the A100 %s", err, stdout.String(), gl.GPUs[1].UUID)
	}
}

func ptr[T any](v T) *T { return &v }

// startWaiting starts gpurun with args on d's socket, to wait for units, and
// returns it (killed when the test ends), its stdout as it fills, and the
// first line of its stderr: the waiting message.
func startWaiting(t *testing.T, d *e2e.Daemon, args ...string) (*exec.Cmd, *strings.Builder, string) {
	t.Helper()
	waiter := exec.Command(e2e.Bin("gpurun"), args...)
	waiter.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	stderr, err := waiter.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := &strings.Builder{}
	waiter.Stdout = stdout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waiter.Process.Kill() })
	line, _ := bufio.NewReader(stderr).ReadString('\n')
	return waiter, stdout, line
}

func setSim(t *testing.T, d *e2e.Daemon, gpu int, u api.SimGPUUpdate) {
	t.Helper()
	if _, err := d.Client.SetSimGPU(e2e.Ctx(t), gpu, u); err != nil {
		t.Fatal(err)
	}
}

// postLease posts a raw lease request and returns the status and error body.
func postLease(t *testing.T, d *e2e.Daemon, body string) (int, api.ErrorBody) {
	t.Helper()
	resp, err := d.HTTP().Post("http://gpulet/v1/leases", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	json.Unmarshal(b, &eb)
	return resp.StatusCode, eb
}
