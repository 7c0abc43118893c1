package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// asRoot runs a Slurm client as root, on the test's cluster.
func (c *slurmCluster) asRoot(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = c.env()
	return cmd.CombinedOutput()
}

// run runs a Slurm client as user u in the jobs' folder, within 60s, and
// returns its stdout; its stderr (srun says there when it queues) is in the
// error.
func (c *slurmCluster) run(u testUser, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}}
	cmd.Env = append(c.env(), "HOME="+c.out, "USER="+u.name)
	cmd.Dir = c.out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%s: %w\n%s", name, err, stderr.String())
	}
	return string(out), err
}

// sbatch submits script as u and returns the job id.
func (c *slurmCluster) sbatch(u testUser, gres, script string) uint64 {
	c.t.Helper()
	out, err := c.run(u, "sbatch", "--parsable", "--gres="+gres, "-o", filepath.Join(c.out, "%j.out"), "--wrap", script)
	if err != nil {
		c.t.Fatalf("sbatch: %v\n%s", err, out)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(strings.Split(out, ";")[0]), 10, 64)
	if err != nil {
		c.t.Fatalf("sbatch printed %q, not a job id", out)
	}
	return id
}

// srunInBackground starts srun as u, waits until its job runs, and returns
// the job id; the srun is killed when the test ends.
func (c *slurmCluster) srunInBackground(u testUser, args ...string) uint64 {
	c.t.Helper()
	cmd := exec.Command("srun", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}}
	cmd.Env = append(c.env(), "HOME="+c.out, "USER="+u.name)
	cmd.Dir = c.out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var job uint64
	testutil.Eventually(c.t, "srun's job to run", func() bool {
		out, _ := c.asRoot("squeue", "-h", "-t", "R", "-u", u.name, "-o", "%i")
		job, _ = strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
		return job != 0
	})
	return job
}

// jobLeases are the live leases of job, as root sees them.
func (c *slurmCluster) jobLeases(job uint64) []api.Lease {
	ls, err := c.d.Client.Leases(e2e.Ctx(c.t))
	if err != nil {
		c.t.Fatal(err)
	}
	var out []api.Lease
	for _, l := range ls {
		if l.Slurm != nil && l.Slurm.JobID == job {
			out = append(out, l)
		}
	}
	return out
}

// waitLease waits for job's one lease.
func (c *slurmCluster) waitLease(job uint64) api.Lease {
	c.t.Helper()
	var ls []api.Lease
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ls = c.jobLeases(job); len(ls) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(ls) != 1 {
		b, _ := os.ReadFile(filepath.Join(c.out, strconv.FormatUint(job, 10)+".out"))
		c.t.Fatalf("job %d holds %d leases, want 1; its output:\n%s", job, len(ls), b)
	}
	return ls[0]
}

// freedWithin waits up to limit for job to hold no lease and says how long
// it took; an error when it still holds one.
func (c *slurmCluster) freedWithin(job uint64, since time.Time, limit time.Duration) (time.Duration, error) {
	for {
		if len(c.jobLeases(job)) == 0 {
			return time.Since(since), nil
		}
		if time.Since(since) > limit {
			return 0, errors.New("job " + strconv.FormatUint(job, 10) + " still holds its lease after " + limit.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scancel cancels job as its user and returns when scancel did.
func (c *slurmCluster) scancel(u testUser, job uint64) time.Time {
	c.t.Helper()
	at := time.Now()
	if out, err := c.run(u, "scancel", strconv.FormatUint(job, 10)); err != nil {
		c.t.Fatalf("scancel %d: %v\n%s", job, err, out)
	}
	return at
}
