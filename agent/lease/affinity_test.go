package lease

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/e2e"
)

// TestTaskRunIsMeasuredWhenItsProcessExits: a task lease that ends by its
// process exiting reports its run time on its GPU's model; one released by
// hand reports nothing. The task's preferred model steers the placement.
func TestTaskRunIsMeasuredWhenItsProcessExits(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	type run struct {
		task, model string
		d           time.Duration
	}
	var mu sync.Mutex
	var runs []run
	last := f.devs[len(f.devs)-1]
	m := f.manager(t, func(c *Config) {
		c.Prefer = func(task string) []string {
			if task == "bert" {
				return []string{last.Name}
			}
			return nil
		}
		c.TaskRan = func(task, model string, d time.Duration) {
			mu.Lock()
			runs = append(runs, run{task, model, d})
			mu.Unlock()
		}
	})
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	holder := Peer{UID: 0, PID: cmd.Process.Pid, Admin: true}
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
	e2e.Eventually(t, "task lease to end", func() bool { return len(m.View().Leases()) == 0 })
	e2e.Eventually(t, "run to be reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 1 || runs[0].task != "bert" || runs[0].model != last.Name || runs[0].d <= 0 {
		t.Fatalf("runs = %+v", runs)
	}
}
