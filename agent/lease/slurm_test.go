package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// slurmNode is a fake cgroup tree of one node and the cgroup file of each
// fake process: what gpuletd reads of a caller in a Slurm job.
type slurmNode struct {
	t     *testing.T
	root  string
	procs *fakeProcs
	mu    sync.Mutex
	files map[int]string
	// poll is how often a job's cgroup is looked at.
	poll time.Duration
}

func newSlurmNode(t *testing.T) *slurmNode {
	if os.Geteuid() != 0 {
		t.Skip("a Slurm job's cgroup must be root's; making one needs root")
	}
	return &slurmNode{t: t, root: t.TempDir(), procs: newFakeProcs(), files: map[int]string{}, poll: 10 * time.Millisecond}
}

func (n *slurmNode) config(c *Config) {
	c.Processes = n.procs
	c.Slurm = SlurmConfig{CgroupRoot: n.root, Poll: n.poll, ReadCgroup: n.read}
}

func (n *slurmNode) read(pid int, start uint64) ([]byte, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, st, err := n.procs.open(pid, start)
	if err != nil {
		return nil, procwatch.ErrGone
	}
	h.Close()
	if st != start {
		return nil, procwatch.ErrGone
	}
	return []byte(n.files[pid]), nil
}

// task starts a process of job in step 0 (v1 layout, uid's job) with its
// task's cgroup, and returns the caller it is.
func (n *slurmNode) task(job int, uid uint32) identity.Peer {
	p := n.procs.spawn(false)
	rel := fmt.Sprintf("slurm/uid_%d/job_%d/step_0/task_0", uid, job)
	dir := filepath.Join(n.root, "freezer", rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	// Every cgroup folder has its cgroup.procs.
	d := filepath.Join(n.root, "freezer")
	for _, c := range strings.Split(rel, "/") {
		d = filepath.Join(d, c)
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err != nil {
			os.WriteFile(filepath.Join(d, "cgroup.procs"), nil, 0o644)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprintf("%d\n", p.pid)), 0o644); err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	n.files[p.pid] = "6:freezer:/" + rel + "\n5:devices:/\n0::/\n"
	n.mu.Unlock()
	return identity.Peer{UID: uid, GID: uid, PID: p.pid}
}

// endJob removes the job's cgroup, as slurmstepd does when its last process
// is gone.
func (n *slurmNode) endJob(job int, uid uint32) {
	if err := os.RemoveAll(filepath.Join(n.root, "freezer", fmt.Sprintf("slurm/uid_%d/job_%d", uid, job))); err != nil {
		n.t.Fatal(err)
	}
}

// pollOnce moves clk to the next look at the jobs' cgroups and waits until
// it is over: each look is a timer of the clock that arms the next one while
// the job goes on, so it is over once as many timers are pending as before,
// or once m holds no lease.
func (n *slurmNode) pollOnce(clk *clock.Fake, m *Manager) {
	n.t.Helper()
	timers := clk.Pending()
	clk.Advance(n.poll)
	testutil.Eventually(n.t, "a look at the job's cgroup", func() bool { return clk.Pending() == timers || len(m.View().Leases()) == 0 })
}

func slurmReq(units int, scope string) Request {
	return Request{LeaseRequest: api.LeaseRequest{Units: units, Slurm: scope}}
}

func TestSlurmLeaseIsTheJobsAndEndsWithIt(t *testing.T) {
	n := newSlurmNode(t)
	f := newFixture(t, 4, 16, 1)
	clk := clock.NewFake(time.Now())
	m := f.manager(t, n.config, func(c *Config) { c.Clock = clk })
	caller := n.task(12, 1000)
	g, err := m.Acquire(context.Background(), caller, slurmReq(2, api.SlurmScopeJob))
	if err != nil {
		t.Fatal(err)
	}
	if g.Binding != string(KindSlurm) || g.Slurm == nil || g.Slurm.JobID != 12 || g.Slurm.Step != "" || g.Owner.UID != 1000 || g.Owner.PID != 0 || len(g.Units) != 2 {
		t.Fatalf("lease %+v (slurm %+v): want a 2-unit slurm lease of job 12, uid 1000, bound to no process", g.Lease, g.Slurm)
	}
	if jobs := m.View().GPUs[g.GPU.Index].Instances[g.Instance].SlurmJobs; !reflect.DeepEqual(jobs, []uint64{12}) {
		t.Fatalf("the instance's Slurm jobs are %v, want [12] (the snapshot shows them)", jobs)
	}
	// Another task of the job gets the job's lease, not a second one, and
	// its caller's exit ends nothing.
	other := n.task(12, 1000)
	g2, err := m.Acquire(context.Background(), other, slurmReq(2, api.SlurmScopeJob))
	if err != nil || g2.ID != g.ID {
		t.Fatalf("second task: %+v, %v; want lease %s again", g2.Lease, err, g.ID)
	}
	if _, err := m.Acquire(context.Background(), other, slurmReq(3, api.SlurmScopeJob)); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("asking more than the job's lease holds: %v, want a conflict", err)
	}
	// Nothing holds the callers' processes, so nothing sees them exit, and
	// the job's next poll keeps the lease.
	for _, p := range []identity.Peer{caller, other} {
		if h := n.procs.procs[p.PID].held(); h != 0 {
			t.Fatalf("%d handle(s) held on the process of pid %d that asked: the lease is the job's, not its", h, p.PID)
		}
	}
	n.procs.procs[caller.PID].exit()
	n.pollOnce(clk, m)
	if len(m.View().Leases()) != 1 {
		t.Fatal("the lease ended with the process that asked; it is the job's")
	}
	n.endJob(12, 1000)
	clk.Advance(n.poll)
	testutil.Eventually(t, "the lease to end with its job", func() bool { return len(m.View().Leases()) == 0 })
	if f.fifoCount(t, g.GPU.Index) != 0 {
		t.Fatal("FIFOs left after the job ended")
	}
}

// TestSlurmLeaseOutlivesAnEmptiedStep: a process left in the job (a setsid
// child in another task) keeps the job's lease; the lease ends once no
// cgroup of the job lists a process.
func TestSlurmLeaseOutlivesAnEmptiedStep(t *testing.T) {
	n := newSlurmNode(t)
	clk := clock.NewFake(time.Now())
	m := newFixture(t, 4, 16, 1).manager(t, n.config, func(c *Config) { c.Clock = clk })
	caller := n.task(5, 0)
	if _, err := m.Acquire(context.Background(), caller, slurmReq(1, api.SlurmScopeJob)); err != nil {
		t.Fatal(err)
	}
	job := filepath.Join(n.root, "freezer", "slurm/uid_0/job_5")
	if err := os.MkdirAll(filepath.Join(job, "step_batch"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(job, "step_batch", "cgroup.procs"), []byte("777\n"), 0o644)
	os.WriteFile(filepath.Join(job, "step_0", "task_0", "cgroup.procs"), nil, 0o644)
	for range 3 {
		n.pollOnce(clk, m)
		if len(m.View().Leases()) != 1 {
			t.Fatal("the lease ended while a process of the job was left")
		}
	}
	os.WriteFile(filepath.Join(job, "step_batch", "cgroup.procs"), nil, 0o644)
	clk.Advance(n.poll)
	testutil.Eventually(t, "the lease to end once the job has no process", func() bool { return len(m.View().Leases()) == 0 })
}

func TestSlurmStepLease(t *testing.T) {
	n := newSlurmNode(t)
	m := newFixture(t, 4, 16, 1).manager(t, n.config)
	g, err := m.Acquire(context.Background(), n.task(7, 0), slurmReq(1, api.SlurmScopeStep))
	if err != nil {
		t.Fatal(err)
	}
	if g.Slurm == nil || *g.Slurm != (api.LeaseSlurm{JobID: 7, Step: "0"}) {
		t.Fatalf("slurm %+v, want job 7 step 0", g.Slurm)
	}
	os.RemoveAll(filepath.Join(n.root, "freezer", "slurm/uid_0/job_7/step_0"))
	testutil.Eventually(t, "the step's lease to end with its step", func() bool { return len(m.View().Leases()) == 0 })
}

func TestSlurmRefusals(t *testing.T) {
	n := newSlurmNode(t)
	m := newFixture(t, 4, 16, 1).manager(t, n.config)
	ctx := context.Background()

	// Not in a job: a plain process's cgroup.
	p := n.procs.spawn(false)
	n.files[p.pid] = "0::/user.slice/user-1000.slice/session-2.scope\n"
	if _, err := m.Acquire(ctx, identity.Peer{UID: 1000, PID: p.pid}, slurmReq(1, "job")); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("caller in no job: %v, want a bad request", err)
	}
	// Another user's job (a uid's cgroup names the job user under v1).
	theirs := n.task(20, 1001)
	if _, err := m.Acquire(ctx, identity.Peer{UID: 1000, PID: theirs.PID}, slurmReq(1, "job")); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("another user's job: %v, want forbidden", err)
	}
	// A job folder a user made (not root's): refused.
	mine := n.task(21, 1000)
	if err := os.Chown(filepath.Join(n.root, "freezer", "slurm/uid_1000/job_21"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, mine, slurmReq(1, "job")); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("a job folder of the user's own: %v, want a bad request", err)
	}
	// A caller that exited: its pid names nothing.
	gone := n.task(22, 1000)
	n.procs.procs[gone.PID].exit()
	if _, err := m.Acquire(ctx, gone, slurmReq(1, "job")); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("a caller that exited: %v, want a bad request", err)
	}
	if len(m.View().Leases()) != 0 {
		t.Fatal("a refused request left a lease")
	}
}

func TestReleaseSlurmJob(t *testing.T) {
	n := newSlurmNode(t)
	m := newFixture(t, 4, 16, 1).manager(t, n.config)
	ctx := context.Background()
	g, err := m.Acquire(ctx, n.task(30, 1000), slurmReq(1, "job"))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := m.Acquire(ctx, n.task(31, 1000), slurmReq(1, "job"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.SlurmJobs().ReleaseJob(identity.Peer{UID: 1000}, 30); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("the job's user releasing by job: %v, want forbidden", err)
	}
	ids, err := m.SlurmJobs().ReleaseJob(identity.Peer{UID: 0}, 30)
	if err != nil || len(ids) != 1 || ids[0] != g.ID {
		t.Fatalf("release job 30: %v, %v; want [%s]", ids, err, g.ID)
	}
	if ls := m.View().Leases(); len(ls) != 1 || ls[0].ID != keep.ID {
		t.Fatalf("after the release: %+v, want only %s", ls, keep.ID)
	}
	if ids, err := m.SlurmJobs().ReleaseJob(identity.Peer{UID: 0}, 30); err != nil || len(ids) != 0 {
		t.Fatalf("releasing again: %v, %v; want nothing", ids, err)
	}
}

// TestSlurmLeaseAcrossRestart: a restart keeps the lease of a job that still
// runs, watched again, and drops that of a job that ended meanwhile.
func TestSlurmLeaseAcrossRestart(t *testing.T) {
	n := newSlurmNode(t)
	f := newFixture(t, 4, 16, 1)
	m := f.manager(t, n.config)
	ctx := context.Background()
	live, err := m.Acquire(ctx, n.task(40, 1000), slurmReq(2, "job"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, n.task(41, 1000), slurmReq(1, "job")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	n.endJob(41, 1000)
	m2 := f.manager(t, n.config)
	ls := m2.View().Leases()
	if len(ls) != 1 || ls[0].ID != live.ID || ls[0].Slurm == nil || ls[0].Slurm.JobID != 40 || ls[0].Binding != string(KindSlurm) {
		t.Fatalf("after restart: %+v; want only %s of job 40", ls, live.ID)
	}
	n.endJob(40, 1000)
	testutil.Eventually(t, "the kept lease to end with its job", func() bool { return len(m2.View().Leases()) == 0 })
}

func TestAddSlurmJob(t *testing.T) {
	var jobs []uint64
	for _, j := range []uint64{7, 3, 7, 12, 3} {
		jobs = addSlurmJob(jobs, j)
	}
	if !reflect.DeepEqual(jobs, []uint64{3, 7, 12}) {
		t.Fatalf("%v, want [3 7 12]", jobs)
	}
}

// TestSlurmDryRunCountsNoProcess: a Slurm lease is the job's, bound to no
// process, so what the caller's process holds does not refuse it, in the
// dry run as in the lease.
func TestSlurmDryRunCountsNoProcess(t *testing.T) {
	n := newSlurmNode(t)
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t, n.config)
	caller := n.task(12, 1000)
	if _, err := m.Acquire(context.Background(), caller, Request{LeaseRequest: api.LeaseRequest{Units: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Explain(caller, slurmReq(1, api.SlurmScopeJob)); err != nil {
		t.Fatalf("dry run of a Slurm lease from a process that holds M units: %v, want where it would go", err)
	}
	if _, err := m.Acquire(context.Background(), caller, slurmReq(1, api.SlurmScopeJob)); err != nil {
		t.Fatalf("Slurm lease from a process that holds M units: %v", err)
	}
}
