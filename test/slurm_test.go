package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestSlurm runs jobs on a real Slurm (munged, slurmctld and slurmd started
// here, proctrack/cgroup) in front of gpuletd, as plain users: the task
// prolog and gpurun lease for the job with the step's shards on Slurm's GPU,
// and the lease ends with the job, by the cgroup watch or the epilog.
func TestSlurm(t *testing.T) {
	c := startSlurm(t)
	alice, bob := c.users[0], c.users[1]
	gpus, err := c.d.Client.GPUs(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	uuidOf := func(index string) string {
		i, err := strconv.Atoi(index)
		if err != nil || i < 0 || i >= len(gpus.GPUs) {
			t.Fatalf("SLURM_STEP_GPUS=%q names no GPU of gpuletd's", index)
		}
		return gpus.GPUs[i].UUID
	}

	t.Run("task prolog gives plain srun the lease's environment", func(t *testing.T) {
		out, err := c.run(alice, "srun", "--gres=shard:4", "sh", "-c", "env; echo ---; gpulet leases --json")
		if err != nil {
			t.Fatalf("srun: %v\n%s", err, out)
		}
		envText, leasesJSON, _ := strings.Cut(out, "---\n")
		env := map[string]string{}
		for _, line := range strings.Split(envText, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		}
		var ll api.LeaseList
		if err := json.Unmarshal([]byte(leasesJSON), &ll); err != nil || len(ll.Leases) != 1 {
			t.Fatalf("the job's user lists %s (%v); want one lease\n%s", leasesJSON, err, out)
		}
		l := ll.Leases[0]
		job, _ := strconv.ParseUint(env["SLURM_JOB_ID"], 10, 64)
		if l.Binding != "slurm" || l.Slurm == nil || l.Slurm.JobID != job || len(l.Units) != 4 || l.Owner.UID != alice.uid {
			t.Fatalf("lease %+v (slurm %+v); want a 4-unit slurm lease of job %d owned by uid %d", l, l.Slurm, job, alice.uid)
		}
		if want := uuidOf(env["SLURM_STEP_GPUS"]); env["CUDA_VISIBLE_DEVICES"] != want || l.GPU.UUID != want {
			t.Fatalf("CUDA_VISIBLE_DEVICES=%s, lease on %s; want Slurm's GPU %s (%s)", env["CUDA_VISIBLE_DEVICES"], l.GPU.UUID, env["SLURM_STEP_GPUS"], want)
		}
		if env["GPULET_LEASE_ID"] != l.ID {
			t.Fatalf("GPULET_LEASE_ID=%q, want %s", env["GPULET_LEASE_ID"], l.ID)
		}
		for k, v := range l.Env {
			if env[k] != v {
				t.Errorf("%s=%q in the task, want the lease's %q", k, env[k], v)
			}
		}
		if _, mps := l.Env["CUDA_MPS_PIPE_DIRECTORY"]; mps && env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "" {
			t.Error("no pinned memory limit in the task")
		}
		if _, err := c.freedWithin(job, time.Now(), time.Second); err != nil {
			t.Fatal(err, "after srun returned")
		}
	})

	t.Run("srun gpurun makes exactly one lease", func(t *testing.T) {
		out, err := c.run(alice, "srun", "--gres=shard:1", "gpurun", "--", "gpulet", "leases", "--json")
		if err != nil {
			t.Fatalf("srun gpurun: %v\n%s", err, out)
		}
		var ll api.LeaseList
		if err := json.Unmarshal([]byte(out), &ll); err != nil || len(ll.Leases) != 1 || len(ll.Leases[0].Units) != 1 || ll.Leases[0].Slurm == nil {
			t.Fatalf("leases in the step: %s (%v); want one 1-unit slurm lease", out, err)
		}
	})

	t.Run("two-step sbatch holds at most its shards and nothing after", func(t *testing.T) {
		job := c.sbatch(alice, "shard:4", "srun --gres=shard:4 gpurun -- sleep 1; srun --gres=shard:4 sleep 1")
		most, seen := 0, 0
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			units := 0
			for _, l := range c.jobLeases(job) {
				units += len(l.Units)
			}
			most = max(most, units)
			if units > 0 {
				seen++
			}
			if seen > 0 && units == 0 && jobGone(c, job) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if seen == 0 || most != 4 {
			b, _ := os.ReadFile(filepath.Join(c.out, strconv.FormatUint(job, 10)+".out"))
			t.Fatalf("job %d held at most %d unit(s) (seen %d times); want its 4 shards\n%s", job, most, seen, b)
		}
		if ls := c.jobLeases(job); len(ls) != 0 {
			t.Fatalf("job %d ended holding %+v", job, ls)
		}
	})

	t.Run("scancel frees within 1s", func(t *testing.T) {
		job := c.sbatch(alice, "shard:2", "srun --gres=shard:2 sleep 300")
		c.waitLease(job)
		took, err := c.freedWithin(job, c.scancel(alice, job), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("freed %s after scancel", took)
	})

	t.Run("a child that ignores SIGTERM holds the units until Slurm's SIGKILL", func(t *testing.T) {
		// An interactive srun: its task's shell and sleep ignore SIGTERM.
		job := c.srunInBackground(alice, "--gres=shard:2", "sh", "-c", `trap "" TERM; sleep 300; sleep 300`)
		c.waitLease(job)
		var sleeper int
		testutil.Eventually(t, "the task's sleep to start", func() bool { sleeper = processOf(t, alice.uid, "sleep"); return sleeper != 0 })
		at := c.scancel(alice, job)
		// While the child lives (Slurm kills it KillWait after SIGTERM, and
		// later still here), the lease stays; once it is gone, the lease
		// ends within 1s.
		var died time.Time
		for deadline := at.Add(30 * time.Second); died.IsZero(); {
			alive := !processExited(sleeper)
			held := len(c.jobLeases(job)) == 1
			switch {
			case !alive:
				died = time.Now()
			case !held:
				t.Fatalf("the lease ended %s after scancel while the job's process %d still ran", time.Since(at), sleeper)
			case time.Now().After(deadline):
				t.Fatalf("Slurm did not kill process %d within 30s of scancel", sleeper)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took, err := c.freedWithin(job, died, time.Second)
		if err != nil {
			t.Fatal(err, "after its last process was killed")
		}
		t.Logf("Slurm killed the child %s after scancel (KillWait %ds); the lease ended %s later", died.Sub(at), slurmKillWait, took)
	})

	t.Run("a setsid child keeps the lease until the job ends", func(t *testing.T) {
		// gpurun's command leaves a setsid child behind and exits at once;
		// the batch script then waits.
		job := c.sbatch(alice, "shard:1", `gpurun -- sh -c 'setsid sleep 300 </dev/null >/dev/null 2>&1 &'; sleep 300`)
		l := c.waitLease(job)
		// gpurun became the command's sh, which exits once the child is
		// off in a session of its own.
		testutil.Eventually(t, "gpurun's command to exit", func() bool {
			return len(processesOf(alice.uid, "gpurun", "sh")) == 0 && sessionLeaderOf(t, alice.uid, "sleep") != 0
		})
		// A lease that stays shows nothing: what ends it wrongly would do so
		// within one of gpuletd's 100ms cgroup polls, so ten go by.
		time.Sleep(time.Second)
		if ls := c.jobLeases(job); len(ls) != 1 || ls[0].ID != l.ID {
			t.Fatalf("after gpurun's command exited: %+v; want lease %s still held for the job", ls, l.ID)
		}
		if _, err := c.freedWithin(job, c.scancel(alice, job), time.Second); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("two users' jobs on one GPU do not block each other", func(t *testing.T) {
		a := c.sbatch(alice, "shard:4", "srun --gres=shard:4 sleep 300")
		b := c.sbatch(bob, "shard:4", "srun --gres=shard:4 sleep 300")
		la, lb := c.waitLease(a), c.waitLease(b)
		if la.Owner.UID != alice.uid || lb.Owner.UID != bob.uid {
			t.Fatalf("owners %d and %d, want the job users %d and %d", la.Owner.UID, lb.Owner.UID, alice.uid, bob.uid)
		}
		if la.GPU.Index != lb.GPU.Index {
			t.Fatalf("Slurm put the jobs on GPUs %d and %d; this check needs them on one", la.GPU.Index, lb.GPU.Index)
		}
		if la.Instance == lb.Instance {
			t.Fatalf("both users' leases are on MPS instance %d of GPU %d: one MPS server serves one user", la.Instance, la.GPU.Index)
		}
		if la.Env["CUDA_MPS_PIPE_DIRECTORY"] != "" && la.Env["CUDA_MPS_PIPE_DIRECTORY"] == lb.Env["CUDA_MPS_PIPE_DIRECTORY"] {
			t.Fatal("both users' leases name one MPS pipe folder")
		}
		// The snapshot names each instance's Slurm jobs.
		s, err := c.d.Client.Snapshot(e2e.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		ins := s.GPUs[la.GPU.Index].Instances
		if !slices.Contains(ins[la.Instance].SlurmJobs, a) || !slices.Contains(ins[lb.Instance].SlurmJobs, b) {
			t.Fatalf("snapshot instances %+v; want job %d on instance %d and job %d on instance %d", ins, a, la.Instance, b, lb.Instance)
		}
		c.scancel(alice, a)
		c.scancel(bob, b)
		for _, job := range []uint64{a, b} {
			if _, err := c.freedWithin(job, time.Now(), 2*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("the epilog releases the job's leases", func(t *testing.T) {
		// The epilog runs once every process of the job is gone; its end
		// is in gpuletd's log when it came before the cgroup watch.
		job := c.sbatch(alice, "shard:1", "srun --gres=shard:1 sleep 300")
		c.waitLease(job)
		if _, err := c.freedWithin(job, c.scancel(alice, job), time.Second); err != nil {
			t.Fatal(err)
		}
		want := "Slurm job " + strconv.FormatUint(job, 10)
		testutil.Eventually(t, "gpuletd to log the end of job's lease", func() bool { return strings.Contains(c.d.Log.String(), want) })
	})

	t.Run("with the epilog off the cgroup watch frees", func(t *testing.T) {
		c.setEpilog(false)
		defer c.setEpilog(true)
		job := c.sbatch(alice, "shard:2", "srun --gres=shard:2 sleep 300")
		c.waitLease(job)
		took, err := c.freedWithin(job, c.scancel(alice, job), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("freed %s after scancel, by the cgroup watch", took)
		// The line is written once the change is published: a moment after
		// the units show free.
		want := "Slurm job " + strconv.FormatUint(job, 10) + " left the node"
		testutil.Eventually(t, "gpuletd to log "+want, func() bool { return strings.Contains(c.d.Log.String(), want) })

		t.Run("a gpuletd restart mid-job keeps the lease, which still ends with the job", func(t *testing.T) {
			job := c.sbatch(alice, "shard:2", "srun --gres=shard:2 sleep 300")
			l := c.waitLease(job)
			// The lease is made in the task prolog, before the task runs: a
			// restart between the two finds the job's cgroup holding
			// slurmstepd alone, which is how a job that left reads.
			testutil.Eventually(t, "the task's sleep to start", func() bool { return processOf(t, alice.uid, "sleep") != 0 })
			if err := c.d.Stop(); err != nil {
				t.Fatal(err)
			}
			c.d.Restart()
			if ls := c.jobLeases(job); len(ls) != 1 || ls[0].ID != l.ID || ls[0].Binding != "slurm" {
				t.Fatalf("after the restart: %+v; want lease %s of job %d", ls, l.ID, job)
			}
			if _, err := c.freedWithin(job, c.scancel(alice, job), time.Second); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// processOf is the one process of uid named comm; 0 when there is none.
func processOf(t *testing.T, uid uint32, comm string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	found := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		var st syscall.Stat_t
		if strings.TrimSpace(string(name)) == comm && syscall.Stat(filepath.Join("/proc", e.Name()), &st) == nil && st.Uid == uid {
			if found != 0 {
				t.Fatalf("uid %d runs two processes named %s", uid, comm)
			}
			found = pid
		}
	}
	return found
}

// processesOf lists the processes of uid named one of comms.
func processesOf(uid uint32, comms ...string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		var st syscall.Stat_t
		if slices.Contains(comms, strings.TrimSpace(string(name))) && syscall.Stat(filepath.Join("/proc", e.Name()), &st) == nil && st.Uid == uid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// sessionLeaderOf is a process of uid named comm that leads its own
// session; 0 when there is none.
func sessionLeaderOf(t *testing.T, uid uint32, comm string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		sid, err := unix.Getsid(pid)
		var st syscall.Stat_t
		if strings.TrimSpace(string(name)) == comm && err == nil && sid == pid && syscall.Stat(filepath.Join("/proc", e.Name()), &st) == nil && st.Uid == uid {
			return pid
		}
	}
	return 0
}

// jobGone reports whether squeue no longer lists job.
func jobGone(c *slurmCluster, job uint64) bool {
	out, err := c.run(c.users[0], "squeue", "-h", "-j", strconv.FormatUint(job, 10), "-o", "%i")
	return err != nil || strings.TrimSpace(out) == ""
}
