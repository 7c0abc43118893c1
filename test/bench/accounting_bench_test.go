package bench

import (
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// BenchmarkLeaseReleaseAccounting is lease+release at 8 clients on a 16-GPU
// node holding 1,000 leases bound to 8 running processes, on gpuletd with
// per-lease accounting (the default) against the same build with
// --accounting=false, in alternating turns. Both sample every 100 ms (ten
// times the default), so that accounting runs ten times as often as it
// would. Goal: x-accounting-off-ops at least 0.95 in every round.
func BenchmarkLeaseReleaseAccounting(b *testing.B) {
	const held, gpus, holders = 1000, 16, 8
	units := fmt.Sprint(64 + held/gpus)
	flags := []string{"--sim-gpus", fmt.Sprintf("%dxA100-80GB", gpus), "--clients-per-instance", units, "--units-per-gpu", units}
	off := startDaemon(b, append(flags, "--accounting=false")...)
	on := startDaemon(b, flags...)
	var pids []int
	for range holders {
		cmd := exec.Command("sleep", "3600")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids = append(pids, cmd.Process.Pid)
	}
	holdBoundLeases(b, off.Socket, held, pids)
	holdBoundLeases(b, on.Socket, held, pids)
	// The comparison means something only if one side accounts and the
	// other does not.
	measured := func(d *e2e.Daemon) bool {
		ls, err := d.Client.Leases(e2e.Ctx(b))
		return err == nil && len(ls) == held && ls[0].Usage != nil && len(ls[0].Usage.PIDs) == 1
	}
	testutil.Eventually(b, "the held leases measured", func() bool { return measured(on) })
	if measured(off) {
		b.Fatal("--accounting=false measured the leases")
	}
	alternate(b, 8, side{off.Socket, leaseRelease}, side{on.Socket, leaseRelease}, "accounting-off")
}

// holdBoundLeases takes n one-unit leases on the gpuletd at sock, bound in
// turn to each of pids, for the rest of the benchmark.
func holdBoundLeases(b *testing.B, sock string, n int, pids []int) {
	b.Helper()
	c := httpClient(sock)
	defer c.CloseIdleConnections()
	for i := range n {
		body := fmt.Sprintf(`{"units":1,"pid":%d}`, pids[i%len(pids)])
		resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		drain(resp)
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("holding lease %d: HTTP %d", i, resp.StatusCode)
		}
	}
}
