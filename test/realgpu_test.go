package test

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/pipefile"
	"github.com/gpulet/gpulet/test/e2e"
)

// These tests hold the simulated backend to what an H100 showed (docs/
// hardware.md): MPS servers that stay up idle after their last client, a
// kernel-time figure that reads 100% for one small job, and processes that
// use more memory than their share.

// TestUsersOneAfterAnotherOnOneInstance: on a GPU with one MPS instance,
// three users run a job one after another. Each job leaves its MPS server up
// and idle, as on the H100; the next user's lease must still land there (it
// was refused: "instance 0 serves another user's MPS clients").
func TestUsersOneAfterAnotherOnOneInstance(t *testing.T) {
	group := e2e.NewGroup(t)
	users := []e2e.User{e2e.NewUser(t, group), e2e.NewUser(t, group), e2e.NewUser(t, group)}
	d, _ := startMPSDaemon(t, "--socket-group", group.Name, "--sim-gpus", "1xH100", "--sample-interval", "50ms")
	openToOthers(t, d)
	gpurun := copyForOthers(t, e2e.Bin("gpurun"))
	for i, u := range users {
		cmd := u.Command(exec.Command(gpurun, "--units", "4", "--", "sleep", "0.5"))
		cmd.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("user %d (uid %d), after the others' jobs ended: %v\n%s", i+1, u.UID, err, out)
		}
		testutil.Eventually(t, fmt.Sprintf("user %d's MPS server up and idle", i+1), func() bool {
			s, err := d.Client.Snapshot(e2e.Ctx(t))
			if err != nil {
				return false
			}
			in := s.GPUs[0].Instances[0]
			return in.UID == nil && len(in.Servers) == 1 && in.Servers[0].UID != nil && *in.Servers[0].UID == u.UID && in.Servers[0].Clients == 0
		})
	}
}

// TestSmallLeasesLeaveTheGPUOpen: two small jobs keep a kernel running all the
// time (kernel time 100%, as utilization.gpu read on the H100), but use few
// SMs (GPM read 24.2% for two clients on 2 of 16 units each, in the check at
// 2f1cbd2 of docs/hardware.md); under --max-utilization 90 the GPU keeps
// taking leases.
func TestSmallLeasesLeaveTheGPUOpen(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xH100", "--max-utilization", "90")
	for range 2 {
		if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 2, TTL: "5m"}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the samples to see the two leases", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].KernelTimePct == 100
	})
	s, _ := d.Client.Snapshot(e2e.Ctx(t))
	g := s.GPUs[0]
	if !g.Eligible || math.Abs(float64(g.UtilizationPct)-24.2) > 2 || g.UtilizationSource != api.UtilSourceSimulated {
		t.Fatalf("GPU eligible %v, SM %d%% from %q: want eligible at the H100's 24.2%% of the SMs (±2), simulated", g.Eligible, g.UtilizationPct, g.UtilizationSource)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 2, TTL: "5m"}); err != nil {
		t.Fatalf("a third small lease: %v", err)
	}
}

// TestBusyJobsReadTheirShare: on a simulated 16-unit H100 under MPS, a job
// that gpurun runs on 2, 4 or 8 units reads the SM figure that GPM read on
// the H100 for a busy client on as many (12.1, 24.2 and 50.0%: the check at
// 2f1cbd2 of docs/hardware.md; test/gpu/run.sh at 33a66a0 read 12% for 2),
// within 2 points, with its MPS server listed as a process of 66 MiB.
func TestBusyJobsReadTheirShare(t *testing.T) {
	d, _ := startMPSDaemon(t, "--sim-gpus", "1xH100", "--sample-interval", "50ms")
	for _, tc := range []struct {
		units string
		gpm   float64
	}{{"2", 12.1}, {"4", 24.2}, {"8", 50.0}} {
		job := exec.Command(e2e.Bin("gpurun"), "--units", tc.units, "--", "sleep", "300")
		job.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
		if err := job.Start(); err != nil {
			t.Fatal(err)
		}
		var g api.GPU
		testutil.Eventually(t, "the job on "+tc.units+" units sampled", func() bool {
			s, err := d.Client.Snapshot(e2e.Ctx(t))
			if err != nil {
				return false
			}
			g = s.GPUs[0]
			return fmt.Sprint(g.UnitsTotal-g.UnitsFree) == tc.units && g.KernelTimePct == 100 && g.UtilizationPct > 0 && len(g.Instances[0].Servers) == 1
		})
		// The GPU's memory: the job's share and its server's own 66 MiB,
		// a process of gpulet's, not one beside it.
		n, _ := strconv.Atoi(tc.units)
		testutil.Eventually(t, "the server's memory counted, the server not taken for an outside process", func() bool {
			s, err := d.Client.Snapshot(e2e.Ctx(t))
			return err == nil && s.GPUs[0].MemoryUsedMiB == s.GPUs[0].MemoryTotalMiB*uint64(n)/16+66 && len(s.GPUs[0].OutsideProcesses) == 0
		})
		if math.Abs(float64(g.UtilizationPct)-tc.gpm) > 2 {
			t.Errorf("a job on %s of 16 units: SM %d%%, the H100 read %.1f%%", tc.units, g.UtilizationPct, tc.gpm)
		}
		job.Process.Kill()
		job.Wait()
		testutil.Eventually(t, "the job's units free and the GPU idle", func() bool {
			s, err := d.Client.Snapshot(e2e.Ctx(t))
			return err == nil && s.GPUs[0].UnitsFree == s.GPUs[0].UnitsTotal && s.GPUs[0].UtilizationPct == 0
		})
	}
}

// TestLeaseUsageIsMeasured: a job's process that uses more than its share of
// the GPU's memory is flagged on its lease, a process beside gpulet is shown
// with its memory, and the lease's peak outlives the job in its end's log
// line and journal record.
func TestLeaseUsageIsMeasured(t *testing.T) {
	e2e.RequireRoot(t, "it sets a process's GPU memory through the simulated GPU controls, which are root's")
	d := e2e.Start(t, "--sim-gpus", "1xH100", "--sample-interval", "50ms")
	job := exec.Command(e2e.Bin("gpurun"), "--units", "1", "--", "sleep", "300")
	job.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Process.Kill(); job.Wait() })
	var id string
	testutil.Eventually(t, "the job's lease measured", func() bool {
		ls, err := d.Client.Leases(e2e.Ctx(t))
		if err != nil || len(ls) != 1 || ls[0].Usage == nil || len(ls[0].Usage.PIDs) != 1 {
			return false
		}
		id = ls[0].ID
		return ls[0].Usage.PIDs[0] == job.Process.Pid && !ls[0].Usage.OverShare
	})
	big, outside := uint64(8000), uint64(3000)
	for _, p := range []api.SimProcess{{PID: job.Process.Pid, MemoryUsedMiB: &big}, {PID: 4000000, MemoryUsedMiB: &outside}} {
		if _, err := d.Client.SetSimGPU(e2e.Ctx(t), 0, api.SimGPUUpdate{Process: &p}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the lease over its share and the outside process shown", func() bool {
		l, err := d.Client.GetLease(e2e.Ctx(t), id)
		s, err2 := d.Client.Snapshot(e2e.Ctx(t))
		if err != nil || err2 != nil || l.Usage == nil {
			return false
		}
		g := s.GPUs[0]
		return l.Usage.MemoryUsedMiB == big && l.Usage.OverShare && l.Usage.MemoryPeakMiB == big &&
			g.LeasesOverShare == 1 && g.OutsideMemoryMiB == outside && len(g.OutsideProcesses) == 1 && g.OutsideProcesses[0].PID == 4000000
	})
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "leases"))
	if code != 0 || !strings.Contains(out, "8000/8000 over share") {
		t.Fatalf("gpulet leases (exit %d):\n%s\nwant the lease's memory, over its share", code, out)
	}
	out, _ = e2e.Output(t, exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "status"))
	if !strings.Contains(out, "processes beside gpulet use 3000 MiB (pid 4000000)") || !strings.Contains(out, "1 lease(s) or claim(s) use more memory than their share") {
		t.Fatalf("gpulet status:\n%s\nwant notes on the outside process and the lease over its share", out)
	}
	metrics, err := d.Client.Metrics(e2e.Ctx(t))
	if err != nil || !bytes.Contains(metrics, []byte(`gpulet_lease_over_share{gpu="0",lease="`+id+`"`)) || !bytes.Contains(metrics, []byte("gpulet_gpu_outside_memory_bytes")) {
		t.Fatalf("metrics lack the lease's or the outside process's series (err %v)", err)
	}
	job.Process.Kill()
	job.Wait()
	testutil.Eventually(t, "the lease's end logged with its peak", func() bool {
		return strings.Contains(d.Log.String(), "peak_memory_mib=8000")
	})
	journal, err := os.ReadFile(filepath.Join(d.RunDir, "leases.journal"))
	if err != nil || !bytes.Contains(journal, []byte(`{"op":"end","id":"`+id+`","peak_memory_mib":8000}`)) {
		t.Fatalf("journal (err %v) lacks the end record with the peak:\n%s", err, journal)
	}
	testutil.Eventually(t, "the lease's series gone with it", func() bool {
		m, err := d.Client.Metrics(e2e.Ctx(t))
		return err == nil && !bytes.Contains(m, []byte(id))
	})
}

// TestOfflineClaimKeepsOffAnotherUsersInstance: with MPS, an offline claim
// goes to an instance that serves no other user. On the H100 a second user's
// claim on an instance busy with a first user's job waited until that job
// ended (docs/hardware.md). Where every instance with room serves another
// user, the claim is refused and says whom.
func TestOfflineClaimKeepsOffAnotherUsersInstance(t *testing.T) {
	group := e2e.NewGroup(t)
	a, b := e2e.NewUser(t, group), e2e.NewUser(t, group)
	d, runDir := startMPSDaemon(t, "--socket-group", group.Name, "--sim-gpus", "1xH100", "--instances-per-gpu", "2", "--sample-interval", "50ms")
	openToOthers(t, d)
	if err := os.Chmod(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	gpurun := copyForOthers(t, e2e.Bin("gpurun"))
	jobOfA := func(units string) *api.Lease {
		t.Helper()
		job := a.Command(exec.Command(gpurun, "--units", units, "--", "sleep", "300"))
		job.Env = append(os.Environ(), "GPULET_SOCKET="+d.Socket)
		var stderr testutil.SyncBuffer
		job.Stderr = &stderr
		if err := job.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { job.Process.Kill(); job.Wait() })
		var l api.Lease
		testutil.Eventually(t, "user A's lease of "+units+" units", func() bool {
			if stderr.String() != "" {
				t.Fatalf("user A's job of %s units: %s", units, stderr.String())
			}
			ls, err := d.Client.Leases(e2e.Ctx(t))
			for _, x := range ls {
				if fmt.Sprint(len(x.Units)) == units {
					l = x
				}
			}
			return err == nil && l.ID != ""
		})
		return &l
	}
	usersSay := func(want string) {
		t.Helper()
		testutil.Eventually(t, "users.json to say "+want, func() bool {
			u, err := pipefile.ReadUsers(runDir)
			return err == nil && u != nil && fmt.Sprint(u.GPUs) == want
		})
	}
	claimOfB := func() (string, error) {
		c := b.Command(exec.Command(gpurun, "--offline", "--units", "2", "--", "printenv", "CUDA_MPS_PIPE_DIRECTORY"))
		c.Env = append(os.Environ(), "GPULET_RUN_DIR="+runDir)
		out, err := c.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	first := jobOfA("2")
	uuid := first.GPU.UUID
	usersSay(fmt.Sprintf("map[%s:[[%d] []]]", uuid, a.UID))
	pipe, err := claimOfB()
	if err != nil || pipe == "" || pipe == first.Env["CUDA_MPS_PIPE_DIRECTORY"] {
		t.Fatalf("user B's claim ran on pipe folder %q (%v); user A's job is on %s: want the other instance", pipe, err, first.Env["CUDA_MPS_PIPE_DIRECTORY"])
	}

	testutil.Eventually(t, "user B's ended claim swept", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0
	})
	// A's second job takes 7 of instance 1's 8 units: instance 0 has 6 free
	// but serves A, instance 1 has 1.
	second := jobOfA("7")
	if second.Instance != 1 {
		t.Fatalf("user A's second job on instance %d, want 1", second.Instance)
	}
	usersSay(fmt.Sprintf("map[%s:[[%d] [%d]]]", uuid, a.UID, a.UID))
	out, err := claimOfB()
	if want := fmt.Sprintf("GPU 0 instance 0 has 6 free but serves uid %d", a.UID); err == nil || !strings.Contains(out, want) {
		t.Fatalf("user B's claim with every instance serving A: %v\n%s\nwant a refusal that says %q", err, out, want)
	}
}
