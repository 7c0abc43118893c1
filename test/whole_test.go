package test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestGpurunWholeGPUs: gpurun --gpus 2 gets two whole GPUs of a real gpuletd,
// in CUDA_VISIBLE_DEVICES order and without MPS; the snapshot shows every
// unit of both leased while it runs; three more whole GPUs, with two whole,
// fail as a whole and wait as a whole; the holder's kill -9 frees all of it.
func TestGpurunWholeGPUs(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "4xA100-80GB")
	ctx := e2e.Ctx(t)
	holder := exec.Command(e2e.Bin("gpurun"), "--gpus", "2", "--", "sh", "-c", `echo "cvd=$CUDA_VISIBLE_DEVICES pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-unset}"; exec sleep 300`)
	holder.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50")
	out, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	line, _ := bufio.NewReader(out).ReadString('\n')
	ls, err := d.Client.Leases(ctx)
	if err != nil || len(ls) != 1 || len(ls[0].GPUs) != 2 {
		t.Fatalf("leases %+v, %v", ls, err)
	}
	l := ls[0]
	want := "cvd=" + l.GPUs[0].UUID + "," + l.GPUs[1].UUID + " pct=unset\n"
	if line != want || l.Owner.PID != holder.Process.Pid {
		t.Fatalf("command saw %q, want %q; lease %+v", line, want, l)
	}
	s, err := d.Client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[int]bool{l.GPUs[0].Index: true, l.GPUs[1].Index: true}
	for _, g := range s.GPUs {
		if held[g.Index] != (g.UnitsUsed == g.UnitsTotal) || !held[g.Index] && g.UnitsUsed != 0 {
			t.Fatalf("GPU %d: %d of %d units used; whole-GPU lease on %v", g.Index, g.UnitsUsed, g.UnitsTotal, held)
		}
	}
	if s.UnitsFree != s.UnitsTotal/2 {
		t.Fatalf("%d of %d units free, want half", s.UnitsFree, s.UnitsTotal)
	}

	// Three more: two GPUs are whole, so none is taken.
	if _, err := d.Client.Lease(ctx, api.LeaseRequest{GPUs: 3, TTL: "1m"}); !errors.Is(err, client.ErrInsufficientUnits) || !strings.Contains(err.Error(), "3 whole GPU(s) asked, 2 of them whole now") {
		t.Fatalf("3 whole GPUs beside 2 leased: %v", err)
	}
	dry, code := gpurun(t, d, "--dry-run", "--gpus", "2")
	if code != 0 || !strings.Contains(dry, "a lease of 2 whole GPU(s) would take GPUs") {
		t.Fatalf("dry run: exit %d %q", code, dry)
	}
	waiter, stdout, msg := startWaiting(t, d, "--gpus", "3", "--wait", "30s", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
	if !strings.Contains(msg, "waiting up to 30s for 3 whole GPU(s)") {
		t.Fatalf("waiting message %q", msg)
	}
	if s, _ := d.Client.Snapshot(ctx); s.UnitsFree != s.UnitsTotal/2 {
		t.Fatalf("the waiter took part of the node: %d of %d units free", s.UnitsFree, s.UnitsTotal)
	}
	holder.Process.Kill()
	holder.Wait()
	if err := waiter.Wait(); err != nil || strings.Count(stdout.String(), "GPU-") != 3 {
		t.Fatalf("waiter: %v, output %q", err, stdout.String())
	}
	// and the GPUs sampled idle: a GPU whose whole-GPU job just ended reads
	// 100% of its SMs until the next sample, as on the H100, and a refusal
	// names every GPU above --max-utilization.
	testutil.Eventually(t, "every unit free after both commands, and every GPU idle", func() bool {
		s, err := d.Client.Snapshot(ctx)
		if err != nil || s.UnitsFree != s.UnitsTotal {
			return false
		}
		for _, g := range s.GPUs {
			if g.UtilizationPct != 0 {
				return false
			}
		}
		return true
	})
	if out, code := gpurun(t, d, "--gpus", "5", "--", "true"); code != 125 || !strings.Contains(out, "can ever fit the request: 5 whole GPU(s) asked, and this node has only 4 that could ever be given whole\n") {
		t.Fatalf("5 whole GPUs of 4: exit %d %q", code, out)
	}
}
