package lease

import (
	"context"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/profiles"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestTaskRunIsMeasuredWhenItsProcessExits: a task lease that ends by its
// process exiting reports its run time on its GPU's model; one released by
// hand reports nothing. The task's preferred model, in the affinity table
// as last published, steers the placement.
func TestTaskRunIsMeasuredWhenItsProcessExits(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	type run struct {
		task, model string
		d           time.Duration
	}
	var mu sync.Mutex
	var runs []run
	last := f.devs[len(f.devs)-1]
	affinity, err := profiles.Open(t.TempDir(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	m := f.manager(t, func(c *Config) {
		c.Profiles = affinity
		c.TaskRan = func(task, model string, _ uint32, d time.Duration) {
			mu.Lock()
			runs = append(runs, run{task, model, d})
			mu.Unlock()
		}
	})
	// Placement reads the table the store last published: here one seeded
	// after the start.
	affinity.Seed(map[string]map[string]time.Duration{"bert": {last.Name: time.Minute}})
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	holder := identity.Peer{UID: root.UID, PID: cmd.Process.Pid, Admin: true}
	l, err := m.Acquire(context.Background(), holder, Request{LeaseRequest: api.LeaseRequest{Units: 1, Task: "bert"}})
	if err != nil {
		t.Fatal(err)
	}
	if l.GPU.Index != last.Index {
		t.Fatalf("task lease on GPU %d, want the preferred model's GPU %d", l.GPU.Index, last.Index)
	}
	released, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, Task: "bert", TTL: "1m"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Release(root, released.ID); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	testutil.Eventually(t, "task lease to end", func() bool { return len(m.View().Leases()) == 0 })
	testutil.Eventually(t, "run to be reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 1 || runs[0].task != "bert" || runs[0].model != last.Name || runs[0].d <= 0 {
		t.Fatalf("runs = %+v", runs)
	}
}

// TestReclaimedBorrowerReportsNoRun: a borrower taken back by a reservation
// ends because its process is told to, not because its task finished: its
// run time says nothing of the task, so TaskRan must not hear of it.
func TestReclaimedBorrowerReportsNoRun(t *testing.T) {
	h := newResHarness(t, 1, 4, 1)
	var mu sync.Mutex
	var runs []string
	h.m.Close()
	h.m = h.f.manager(t, func(c *Config) {
		c.Clock, c.Processes, c.Accounts = h.clock, h.procs, accts
		c.ReservationsPath, c.ReclaimGrace = h.path, 10*time.Second
		c.TaskRan = func(task, model string, _ uint32, d time.Duration) {
			mu.Lock()
			runs = append(runs, task)
			mu.Unlock()
		}
	})
	h.reserve(alice, spec("wf1", []int{1, 4}, member("bob", 0)))
	h.fill()
	h.clock.Advance(time.Millisecond)
	// It ignores SIGTERM: the test, not the pidfd watcher's goroutine,
	// delivers its exit, so that it knows when TaskRan would be told.
	p := h.procs.spawn(true)
	g, err := h.m.Acquire(context.Background(), bob, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: p.pid, Task: "bert", Preemptible: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Preemptible {
		t.Fatalf("not a borrow: %+v", g.Lease)
	}
	h.clock.Advance(time.Minute)
	if _, err := h.m.Reservations().Advance(alice, "wf1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.got(), []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("the borrower got %v, want SIGTERM", p.got())
	}
	// Its exit, as the watcher delivers it: TaskRan would be told before
	// exited returns.
	h.m.exited(g.ID)
	if _, err := h.m.Get(root, g.ID); err == nil {
		t.Fatal("the borrower's lease outlived its process")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 0 {
		t.Fatalf("a reclaimed borrower's run was reported as a measured run: %v", runs)
	}
}
