package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// processLease starts a sleep and leases a unit bound to it; the sleep is
// killed when the test ends.
func processLease(t *testing.T, m *Manager) (*exec.Cmd, Grant) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	holder := identity.Peer{UID: root.UID, PID: cmd.Process.Pid, Admin: true}
	l, err := m.Acquire(context.Background(), holder, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return cmd, l
}

func TestProcessBoundLeaseEndsWithItsProcess(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	cmd, l := processLease(t, m)
	if l.Owner.PID != cmd.Process.Pid || l.Expires != nil {
		t.Fatalf("lease %+v not bound to pid %d", l, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	testutil.Eventually(t, "lease to end after its process was killed", func() bool { return len(m.View().Leases()) == 0 })
	if f.fifoCount(t, l.GPU.Index) != 0 {
		t.Fatal("FIFO left after the holder died")
	}
}

// TestPidRefusalsLookAlike: a caller who is not an admin gets one answer for
// another user's process, a thread of it, and a pid that runs nothing, so that
// it learns nothing about other users' processes.
func TestPidRefusalsLookAlike(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a process as another user")
	}
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	// The caller is uid 4242; a sleep of uid 4243 and this test process,
	// root's, with its threads, are other users'.
	theirs := exec.Command("sleep", "60")
	theirs.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4243, Gid: 4243}}
	if err := theirs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { theirs.Process.Kill(); theirs.Wait() })
	thread := 0
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if tid, _ := strconv.Atoi(e.Name()); tid != 0 && tid != os.Getpid() {
			thread = tid
		}
	}
	if thread == 0 {
		t.Fatal("no thread besides the leader")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	caller := identity.Peer{UID: 4242, GID: 4242, PID: os.Getpid()}
	for name, pid := range map[string]int{"pid 1": 1, "another user's process": theirs.Process.Pid, "a thread of root's": thread, "no process": gone.Process.Pid} {
		_, err := m.Acquire(context.Background(), caller, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: pid}})
		want := fmt.Sprintf("pid: process %d is not running or is not yours (give a process id, not a thread id)", pid)
		if !errors.Is(err, api.ErrBadRequest) || err.Error() != want {
			t.Errorf("%s: err = %v, want bad_request %q", name, err, want)
		}
	}
	// An admin is told what the id is.
	_, err = m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: thread}})
	if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "is a thread id") {
		t.Errorf("admin with a thread id: err = %v, want bad_request naming a thread", err)
	}
	if len(m.View().Leases()) != 0 {
		t.Fatal("a refused pid left a lease")
	}
}

// TestOwnProcessBindsThroughItsPidfd: with a pidfd of the process that
// connected, the lease is bound to it; once it has exited, no lease is granted
// even though its pid may name another process by then.
func TestOwnProcessBindsThroughItsPidfd(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	defer pidfd.Close()
	// The pid says this test process; the pidfd, which wins, the sleep. (A
	// real peer's pid and pidfd agree; here they differ to show which one
	// the lease follows.)
	peer := identity.Peer{UID: uint32(os.Getuid()), PID: cmd.Process.Pid, PIDFD: pidfd}
	l, err := m.Acquire(context.Background(), peer, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Owner.PID != cmd.Process.Pid {
		t.Fatalf("lease bound to pid %d, want %d", l.Owner.PID, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	testutil.Eventually(t, "lease to end with the process its pidfd held", func() bool { return len(m.View().Leases()) == 0 })
	_, err = m.Acquire(context.Background(), peer, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "which connected, is not running") {
		t.Fatalf("lease for an exited peer: err = %v, want bad_request", err)
	}
}

func TestTTLExpiresAndRenewExtends(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	c := clock.NewFake(time.Now())
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	l, err := m.Acquire(context.Background(), root, ttlReq(1, "1s"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Binding != "ttl" {
		t.Fatalf("binding %q, want ttl", l.Binding)
	}
	// Renewing moves the deadline; the timer that fires at the old deadline
	// must not end the lease.
	c.Advance(900 * time.Millisecond)
	r, err := m.Renew(root, l.ID)
	if err != nil || !r.Expires.After(*l.Expires) {
		t.Fatalf("renew: %+v, %v", r, err)
	}
	c.Advance(300 * time.Millisecond)
	testutil.Eventually(t, "the old deadline's timer to be replaced", func() bool { return c.Pending() == 1 })
	if len(m.View().Leases()) != 1 {
		t.Fatal("lease ended at its old deadline after a renewal")
	}
	c.Advance(2 * time.Second)
	testutil.Eventually(t, "ttl lease to expire", func() bool { return len(m.View().Leases()) == 0 })
	if f.fifoCount(t, 0) != 0 {
		t.Fatal("expired lease left its FIFO")
	}
}

// TestDryRunOfAnotherUsersPid: the dry run of a lease bound to "pid" gives a
// caller who is not an admin the answer the lease gets, never what another
// user's process holds.
func TestDryRunOfAnotherUsersPid(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t)
	cmd, _ := processLease(t, m)
	pid := cmd.Process.Pid
	caller := identity.Peer{UID: 4242, GID: 4242, PID: os.Getpid()}
	req := Request{LeaseRequest: api.LeaseRequest{Units: 2, PID: pid}}
	_, err := m.Acquire(context.Background(), caller, req)
	want := fmt.Sprintf("pid: process %d is not running or is not yours (give a process id, not a thread id)", pid)
	if !errors.Is(err, api.ErrBadRequest) || err.Error() != want {
		t.Fatalf("lease on root's process: err = %v, want bad_request %q", err, want)
	}
	if _, dryErr := m.Explain(caller, req); dryErr == nil || dryErr.Error() != want {
		t.Fatalf("dry run on root's process: err = %v, want the lease's %q", dryErr, want)
	}
}
