package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/placement"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/e2e"
)

type fixture struct {
	dir    string
	model  units.Model
	devs   []inventory.Device
	ledger *ledger.Ledger
}

func newFixture(t *testing.T, m, n, k int) *fixture {
	t.Helper()
	model, err := units.New(m, n, k, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fixtureAt(t, runDir(t), model)
}

// fixtureAt is a fixture whose run dir is dir.
func fixtureAt(t *testing.T, dir string, model units.Model) *fixture {
	t.Helper()
	sim := inventory.NewSim("test", []inventory.Model{inventory.Models[5], inventory.Models[0]})
	f := &fixture{dir: dir, model: model, devs: sim.Devices()}
	var err error
	var gpus []ledger.GPU
	for _, d := range f.devs {
		gpus = append(gpus, ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name})
	}
	if f.ledger, err = ledger.New(f.dir, model, gpus, -1, quietLog()); err != nil {
		t.Fatal(err)
	}
	return f
}

// runDir is a run dir on tmpfs when there is one, as /run is in production:
// tmpfs never reuses an inode number at once, which some tests rely on to
// tell one FIFO from the next at the same name.
func runDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "gpulet-lease-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (f *fixture) manager(t *testing.T, mutate ...func(*Config)) *Manager {
	t.Helper()
	cfg := Config{
		Model: f.model, Devices: f.devs, Ledger: f.ledger,
		JournalPath: filepath.Join(f.dir, "leases.journal"), Policy: placement.BestFit, Logger: quietLog(),
	}
	for _, fn := range mutate {
		fn(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); m.Close() })
	if err := m.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

// fifoCount counts the unit FIFOs of GPU g on disk.
func (f *fixture) fifoCount(t *testing.T, g int) int {
	t.Helper()
	got, err := f.ledger.Scan(g)
	if err != nil {
		t.Fatal(err)
	}
	return len(got)
}

func ttlReq(units int, ttl string) Request {
	r := Request{LeaseRequest: api.LeaseRequest{Units: units, TTL: ttl}}
	r.TTL, _ = time.ParseDuration(ttl)
	return r
}

var root = Peer{UID: 0, GID: 0, PID: os.Getpid(), Admin: true}

func TestGrantAndRelease(t *testing.T) {
	f := newFixture(t, 2, 4, 2)
	m := f.manager(t)
	l, err := m.Acquire(context.Background(), root, ttlReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Units) != 2 || l.Env["CUDA_VISIBLE_DEVICES"] != l.GPU.UUID || l.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" {
		t.Fatalf("lease %+v", l)
	}
	for _, u := range l.Units {
		if !f.ledger.Present(l.GPU.Index, u) || f.model.InstanceOf(u) != l.Instance {
			t.Fatalf("unit %d: FIFO missing or outside instance %d", u, l.Instance)
		}
	}
	if v := m.View(); v.GPUs[l.GPU.Index].Used != 2 || len(v.Leases()) != 1 {
		t.Fatalf("view %+v", v)
	}
	if err := m.Release(Peer{UID: 1000}, l.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("another user released the lease: %v", err)
	}
	if err := m.Release(root, l.ID); err != nil {
		t.Fatal(err)
	}
	if f.fifoCount(t, l.GPU.Index) != 0 || m.View().GPUs[l.GPU.Index].Used != 0 {
		t.Fatal("release left units or FIFOs")
	}
}

func TestPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy placement.Policy
		second int // GPU of the second single-unit lease
	}{{placement.BestFit, 0}, {placement.FirstFit, 0}, {placement.Spread, 1}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			f := newFixture(t, 1, 4, 1)
			m := f.manager(t, func(c *Config) { c.Policy = tc.policy })
			a, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
			if err != nil {
				t.Fatal(err)
			}
			if a.GPU.Index != 0 || b.GPU.Index != tc.second {
				t.Fatalf("placed on GPUs %d and %d", a.GPU.Index, b.GPU.Index)
			}
		})
	}
}

func TestRequestChecks(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t)
	for _, tc := range []struct {
		name string
		req  api.LeaseRequest
		want error
		msg  string
	}{
		{"more than M", api.LeaseRequest{Units: 3, TTL: "1m"}, api.ErrBadRequest, "--units-per-client 2"},
		{"no such gpu index", api.LeaseRequest{Units: 1, GPU: "7", TTL: "1m"}, api.ErrBadRequest, "no GPU with index 7"},
		{"no such uuid", api.LeaseRequest{Units: 1, GPU: "GPU-nope", TTL: "1m"}, api.ErrBadRequest, "no GPU with UUID"},
		{"no such type", api.LeaseRequest{Units: 1, Type: "H100", TTL: "1m"}, placement.ErrNeverFits, `not of type "H100"`},
		{"no such type, waiting", api.LeaseRequest{Units: 1, Type: "H100", TTL: "1m", Wait: "1h"}, placement.ErrNeverFits, "can ever fit"},
		{"unknown pool", api.LeaseRequest{Units: 1, Pool: "p", TTL: "1m"}, api.ErrNotFound, "pool"},
		{"dead pid", api.LeaseRequest{Units: 1, PID: 1 << 30}, api.ErrBadRequest, "not running"},
		{"too much memory", api.LeaseRequest{Units: 1, MemoryMiB: 1 << 30, TTL: "1m"}, placement.ErrNeverFits, "81920 MiB in all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{LeaseRequest: tc.req}
			req.TTL, _ = time.ParseDuration(tc.req.TTL)
			req.Wait, _ = time.ParseDuration(tc.req.Wait)
			// A request that can never fit does not wait, so a long wait
			// ends the test only by a failure.
			_, err := m.Acquire(context.Background(), root, req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
	if f.fifoCount(t, 0)+f.fifoCount(t, 1) != 0 {
		t.Fatal("a refused request left FIFOs")
	}
}

func TestTypeAndGPUSelection(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	l, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, Type: "t4"}, TTL: time.Minute})
	if err != nil || l.GPU.Index != 1 {
		t.Fatalf("type t4 placed on %+v, %v", l.GPU, err)
	}
	l, err = m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: f.devs[1].UUID}, TTL: time.Minute})
	if err != nil || l.GPU.Index != 1 {
		t.Fatalf("gpu by uuid placed on %+v, %v", l.GPU, err)
	}
}

func TestConcurrentAcquireNeverGrantsAUnitTwice(t *testing.T) {
	f := newFixture(t, 1, 8, 2) // 2 GPUs × 16 units
	m := f.manager(t)
	const clients = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := map[[2]int]string{}
	var refused int
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !errors.Is(err, api.ErrInsufficientUnits) {
					t.Errorf("unexpected error %v", err)
				}
				refused++
				return
			}
			for _, u := range l.Units {
				key := [2]int{l.GPU.Index, u}
				if other, dup := granted[key]; dup {
					t.Errorf("unit %v granted to %s and %s", key, other, l.ID)
				}
				granted[key] = l.ID
			}
		}()
	}
	wg.Wait()
	if len(granted) != 32 || refused != clients-32 {
		t.Fatalf("granted %d, refused %d", len(granted), refused)
	}
	v := m.View()
	for g := range f.devs {
		if f.fifoCount(t, g) != v.GPUs[g].Used {
			t.Fatalf("GPU %d: %d FIFOs, table says %d used", g, f.fifoCount(t, g), v.GPUs[g].Used)
		}
	}
}

// processLease starts a sleep and leases a unit bound to it; the sleep is
// killed when the test ends.
func processLease(t *testing.T, m *Manager) (*exec.Cmd, Grant) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	holder := Peer{UID: 0, PID: cmd.Process.Pid, Admin: true}
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
	e2e.Eventually(t, "lease to end after its process was killed", func() bool { return len(m.View().Leases()) == 0 })
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
	caller := Peer{UID: 4242, GID: 4242, PID: os.Getpid()}
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
	peer := Peer{UID: uint32(os.Getuid()), PID: cmd.Process.Pid, PIDFD: pidfd}
	l, err := m.Acquire(context.Background(), peer, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Owner.PID != cmd.Process.Pid {
		t.Fatalf("lease bound to pid %d, want %d", l.Owner.PID, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	e2e.Eventually(t, "lease to end with the process its pidfd held", func() bool { return len(m.View().Leases()) == 0 })
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
	e2e.Eventually(t, "the old deadline's timer to be replaced", func() bool { return c.Pending() == 1 })
	if len(m.View().Leases()) != 1 {
		t.Fatal("lease ended at its old deadline after a renewal")
	}
	c.Advance(2 * time.Second)
	e2e.Eventually(t, "ttl lease to expire", func() bool { return len(m.View().Leases()) == 0 })
	if f.fifoCount(t, 0) != 0 {
		t.Fatal("expired lease left its FIFO")
	}
}

func TestWaitIsServedWhenUnitsFree(t *testing.T) {
	f := newFixture(t, 1, 2, 1) // 2 GPUs × 2 units
	m := f.manager(t)
	var held []api.Lease
	for i := 0; i < 4; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l.Lease)
	}
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("full node: %v", err)
	}
	req := ttlReq(1, "1m")
	req.Wait = 10 * time.Second
	got := make(chan error, 1)
	go func() {
		_, err := m.Acquire(context.Background(), root, req)
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := m.Release(root, held[2].ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not served after a release")
	}
	// A waiter that times out gets insufficient_units and leaves nothing.
	req.Wait = 50 * time.Millisecond
	if _, err := m.Acquire(context.Background(), root, req); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("timed-out waiter: %v", err)
	}
	// A cancelled waiter leaves nothing either.
	ctx, cancel := context.WithCancel(context.Background())
	req.Wait = time.Minute
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := m.Acquire(ctx, root, req); err == nil {
		t.Fatal("cancelled waiter got a lease")
	}
	if n := len(m.View().Leases()); n != 4 {
		t.Fatalf("%d leases, want 4", n)
	}
}

// claimOffline claims unit i of GPU g the way DESIGN section 5 says, returning
// the descriptor that holds the claim.
func claimOffline(t *testing.T, f *fixture, g, i int) int {
	t.Helper()
	dir := filepath.Dir(f.ledger.Path(g, i))
	tmp := filepath.Join(dir, ".claim-test")
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := unix.Link(tmp, f.ledger.Path(g, i)); err != nil {
		t.Fatal(err)
	}
	unix.Unlink(tmp)
	return fd
}

func TestOfflineClaimsAreCountedAndNeverLeased(t *testing.T) {
	f := newFixture(t, 1, 2, 1) // 2 units per GPU
	m := f.manager(t)
	fd := claimOffline(t, f, 0, 0)
	e2e.Eventually(t, "offline claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	unix.Mkfifo(f.ledger.Path(0, 1), 0o600) // a claim nobody holds: stale
	e2e.Eventually(t, "second claim counted", func() bool { return m.View().GPUs[0].Offline == 2 })
	l, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: time.Minute})
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("leased a claimed unit: %+v %v", l, err)
	}
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 1 || f.ledger.Present(0, 1) {
		t.Fatalf("stale claim not removed: %+v", v.GPUs[0])
	}
	unix.Close(fd)
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Used != 0 {
		t.Fatalf("released claim still counted: %+v", v.GPUs[0])
	}
}

func TestRestartKeepsLiveLeasesAndFreesDeadOnes(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	live := exec.Command("sleep", "60")
	dead := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{live, dead} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	l1, err := m1.Acquire(context.Background(), Peer{PID: live.Process.Pid, Admin: true}, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m1.Acquire(context.Background(), Peer{PID: dead.Process.Pid, Admin: true}, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	l3, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon "crashes": it stops watching without ending anything.
	m1.Close()
	dead.Process.Kill()
	dead.Wait()
	// A FIFO nobody holds and no lease owns appears meanwhile.
	unix.Mkfifo(f.ledger.Path(1, 3), 0o600)

	m2 := f.manager(t)
	v := m2.View()
	ids := []string{}
	for _, l := range v.Leases() {
		ids = append(ids, l.ID)
	}
	if !slices.Contains(ids, l1.ID) || !slices.Contains(ids, l3.ID) || slices.Contains(ids, l2.ID) {
		t.Fatalf("after restart leases %v; want %s and %s kept, %s freed", ids, l1.ID, l3.ID, l2.ID)
	}
	got, _ := m2.Get(root, l3.ID)
	if !got.Expires.Equal(*l3.Expires) {
		t.Fatalf("ttl lease deadline changed: %v -> %v", l3.Expires, got.Expires)
	}
	total := 0
	for g := range f.devs {
		if f.fifoCount(t, g) != v.GPUs[g].Used {
			t.Fatalf("GPU %d: %d FIFOs, %d used", g, f.fifoCount(t, g), v.GPUs[g].Used)
		}
		total += v.GPUs[g].Used
	}
	if total != 2 {
		t.Fatalf("%d units used after restart, want 2", total)
	}
	live.Process.Kill()
	live.Wait()
	e2e.Eventually(t, "kept lease to end with its process", func() bool { return len(m2.View().Leases()) == 1 })
}

func TestCorruptJournalIsRebuiltFromLedger(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	os.WriteFile(filepath.Join(f.dir, "leases.journal"), []byte("{not json"), 0o600)
	unix.Mkfifo(f.ledger.Path(0, 2), 0o600)
	m := f.manager(t)
	if v := m.View(); len(v.Leases()) != 0 || v.GPUs[0].Used != 0 || f.ledger.Present(0, 2) {
		t.Fatalf("after corrupt journal: %+v", v)
	}
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if !strings.Contains(string(b), JournalSchema) {
		t.Fatalf("journal not rewritten: %s", b)
	}
}

func TestDrainingRefusesNewLeases(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) {
		c.Conditions = func() *Conditions { return &Conditions{Draining: true} }
	})
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("draining node: %v", err)
	}
}

func TestIneligibleGPUIsSkippedWithReason(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) {
		c.Conditions = func() *Conditions {
			return &Conditions{GPUs: []GPUCondition{{Unusable: "is 95% busy"}, {Unusable: "failed: lost"}}}
		}
	})
	_, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "95% busy") {
		t.Fatalf("err = %v", err)
	}
}

func TestMPSEnv(t *testing.T) {
	f := newFixture(t, 2, 4, 2)
	m := f.manager(t, func(c *Config) {
		c.MPS = true
		c.InstanceEnv = func(g, k int) map[string]string {
			return map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/p/" + f.devs[g].UUID}
		}
	})
	l, err := m.Acquire(context.Background(), root, ttlReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" || l.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/p/"+l.GPU.UUID {
		t.Fatalf("env %v", l.Env)
	}
	req := ttlReq(1, "1m")
	req.MemoryMiB = 8000
	l, err = m.Acquire(context.Background(), root, req)
	if err != nil || l.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=8000M" {
		t.Fatalf("env with memory_mib: %v %v", l.Env, err)
	}
}

func TestMPSKeepsUsersApart(t *testing.T) {
	f := newFixture(t, 1, 4, 2) // 2 instances of 4 units per GPU
	m := f.manager(t, func(c *Config) { c.MPS = true; c.Devices = c.Devices[:1] })
	alice, bob := Peer{UID: 1001, Admin: true}, Peer{UID: 1002, Admin: true}
	a, err := m.Acquire(context.Background(), alice, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire(context.Background(), bob, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Instance == b.Instance {
		t.Fatalf("alice and bob share instance %d", a.Instance)
	}
	a2, err := m.Acquire(context.Background(), alice, ttlReq(1, "1m"))
	if err != nil || a2.Instance != a.Instance {
		t.Fatalf("alice's second lease on instance %d (first on %d): %v", a2.Instance, a.Instance, err)
	}
	// A third user finds every instance serving someone else.
	_, err = m.Acquire(context.Background(), Peer{UID: 1003, Admin: true}, ttlReq(1, "1m"))
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("third user: %v", err)
	}
}

func TestJournalStaysShortAndReplays(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	keep, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 600; i++ {
		l, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m1.Renew(root, l.ID); err != nil {
			t.Fatal(err)
		}
		if err := m1.Release(root, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines > 300 {
		t.Fatalf("journal has %d records after 1800 changes: not rewritten", lines)
	}
	m1.Close()
	m2 := f.manager(t)
	if v := m2.View(); len(v.Leases()) != 1 || v.Leases()[0].ID != keep.ID {
		t.Fatalf("after replay: %+v", v.Leases())
	}
}

// TestReplacedOfflineClaimIsProbedByItsOwnFIFO: a claim whose FIFO is replaced
// by another claimer's (their remove and create seen as one) must be probed,
// and freed, by the FIFO that is there now.
func TestReplacedOfflineClaimIsProbedByItsOwnFIFO(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	fdA := claimOffline(t, f, 0, 2)
	e2e.Eventually(t, "claim A counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	// A goes and B takes the same unit before the daemon looks.
	unix.Unlink(f.ledger.Path(0, 2))
	unix.Close(fdA)
	fdB := claimOffline(t, f, 0, 2)
	(*ledgerEvents)(m).Units([]ledger.UnitEvent{{GPU: 0, Unit: 2}})
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 1 {
		t.Fatalf("B's live claim lost: %+v", v.GPUs[0])
	}
	unix.Close(fdB)
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 0 || f.ledger.Present(0, 2) {
		t.Fatalf("B's stale claim never removed: %+v", v.GPUs[0])
	}
}

// TestRestoreDropsALeaseWhoseUnitWasClaimedOffline: while the daemon was down,
// a kept lease's FIFO was removed and an offline claimer took the unit.
func TestRestoreDropsALeaseWhoseUnitWasClaimedOffline(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	l, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()
	unix.Unlink(f.ledger.Path(l.GPU.Index, l.Units[0]))
	fd := claimOffline(t, f, l.GPU.Index, l.Units[0])
	defer unix.Close(fd)
	m2 := f.manager(t)
	v := m2.View()
	if len(v.Leases()) != 0 || v.GPUs[l.GPU.Index].Offline != 1 || v.GPUs[l.GPU.Index].Used != 1 {
		t.Fatalf("after restore: leases %d, GPU %+v", len(v.Leases()), v.GPUs[l.GPU.Index])
	}
}

// TestClosedManagerLeavesLeasesToTheNextStart: once the daemon stops, nothing
// it still hears (a holder's exit, a release) may end a lease: the lease stays
// in the journal and the ledger for the next start to judge.
func TestClosedManagerLeavesLeasesToTheNextStart(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	cmd, l := processLease(t, m)
	kept, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	cmd.Process.Kill()
	cmd.Wait()
	// Close took the pidfd, so the exit reaches no one; and what was already
	// on its way (an exit seen, a timer fired, a release) ends nothing.
	m.end(l.ID, "process exited")
	m.expire(kept.ID)
	if err := m.Release(root, kept.ID); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("release after Close: %v", err)
	}
	if f.fifoCount(t, 0) != 2 {
		t.Fatalf("%d FIFOs after Close, want both leases' 2", f.fifoCount(t, 0))
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := decodeJournal(b, m.shapes())
	if err != nil || len(rep.entries) != 2 {
		t.Fatalf("journal after Close holds %d leases (%v), want 2", len(rep.entries), err)
	}
	// The next start judges them: the holder is dead, the ttl lease lives.
	m2 := f.manager(t)
	if v := m2.View(); len(v.Leases()) != 1 || v.Leases()[0].ID != kept.ID {
		t.Fatalf("after restart: %+v, want only %s (and not %s)", v.Leases(), kept.ID, l.ID)
	}
}

// TestClaimRightBehindLeaseChurnIsCounted: the watch skips the events of the
// daemon's own FIFOs by count; a claim whose events arrive among them, on the
// very unit the churn keeps using, must still be counted, never leased, and
// freed when dropped, and once every event is in, no skip may remain pending.
func TestClaimRightBehindLeaseChurnIsCounted(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	pending := func() (n uint32) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, g := range m.gpus {
			for _, s := range g.slots {
				n += s.own
			}
		}
		return n
	}
	for round := 0; round < 20; round++ {
		for i := 0; i < 50; i++ {
			l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Release(root, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		// Best fit keeps taking unit 0 of GPU 0: claim it while the churn's
		// events may still be on their way.
		fd := claimOffline(t, f, 0, 0)
		e2e.Eventually(t, "claim behind churn counted", func() bool { return m.View().GPUs[0].Offline == 1 })
		l, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: time.Minute})
		if err != nil || l.Units[0] == 0 {
			t.Fatalf("round %d: lease %+v, %v: the claimed unit was leased", round, l, err)
		}
		m.Release(root, l.ID)
		unix.Close(fd)
		m.probeOffline()
		e2e.Eventually(t, "dropped claim freed", func() bool { return m.View().GPUs[0].Used == 0 })
		e2e.Eventually(t, "every own event arrived", func() bool { return pending() == 0 })
	}
}

// TestLeaseLinesStayWithinTheirBudget: past leaseLinesPerSecond, grant and
// end lines are counted, one line says how many were left out, and the
// counters still count every lease.
func TestLeaseLinesStayWithinTheirBudget(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	var logs e2e.SyncBuffer
	c := clock.NewFake(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.Clock = c
	})
	const n = 250
	for i := 0; i < n; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Release(root, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(msg string) int { return strings.Count(logs.String(), `msg="`+msg+`"`) }
	if got := lines("lease granted") + lines("lease ended"); got != leaseLinesPerSecond {
		t.Fatalf("%d lease lines within one second, want the budget of %d", got, leaseLinesPerSecond)
	}
	c.Advance(time.Second)
	m.Tick()
	want := fmt.Sprintf("left_out=%d", 2*n-leaseLinesPerSecond)
	if !strings.Contains(logs.String(), want) {
		t.Fatalf("no line saying %s:\n%s", want, logs.String())
	}
	if v := m.View(); v.Granted != n || v.Ended != n {
		t.Fatalf("counted %d granted, %d ended; want %d each", v.Granted, v.Ended, n)
	}
	// A new second has a new budget.
	l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), l.ID) {
		t.Fatal("the first grant of a new second was not logged")
	}
}

// TestRenewWhileGrantsGoOut: a lease is visible (List) the moment it is in the
// table, so its owner or an admin may renew it while its grant is still being
// answered; the answer must be a copy made under the lock (run with -race).
func TestRenewWhileGrantsGoOut(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, l := range m.List(root) {
				m.Renew(root, l.ID)
			}
		}
	}()
	for i := 0; i < 300; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(l.JSON, []byte(l.ID)) {
			t.Fatalf("grant JSON %s is not lease %s", l.JSON, l.ID)
		}
		m.Release(root, l.ID)
	}
	close(stop)
	wg.Wait()
}

// One process holds at most M units across all its process-bound leases;
// ttl leases are bound to no process and do not count.
func TestOneProcessHoldsAtMostMUnits(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t)
	bound := Request{LeaseRequest: api.LeaseRequest{Units: 1}}
	first, err := m.Acquire(context.Background(), root, bound)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(context.Background(), root, bound); err != nil {
		t.Fatal(err)
	}
	_, err = m.Acquire(context.Background(), root, bound)
	if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "holds 2 unit(s) already") {
		t.Fatalf("third unit for one process: %v, want bad_request naming what it holds", err)
	}
	if _, err := m.Acquire(context.Background(), root, ttlReq(2, "1m")); err != nil {
		t.Fatalf("a ttl lease counted against the process: %v", err)
	}
	if err := m.Release(root, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(context.Background(), root, bound); err != nil {
		t.Fatalf("after a release the process may hold a unit again: %v", err)
	}
}

// A refusal that changed the table (the grant found an offline claim the
// watch had not counted yet) is in the published view before the caller
// hears of it: what readers see never contradicts a placement failure.
func TestRefusalIsPublishedBeforeItIsAnswered(t *testing.T) {
	f := newFixture(t, 1, 1, 1)
	m := f.manager(t)
	// Both GPUs' only unit claimed offline, as fast as the watch can see.
	claimOffline(t, f, 0, 0)
	claimOffline(t, f, 1, 0)
	_, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("err = %v, want insufficient_units", err)
	}
	v := m.View()
	if v.GPUs[0].Offline != 1 || v.GPUs[1].Offline != 1 {
		t.Fatalf("after the refusal the view shows %d and %d offline units, want 1 and 1", v.GPUs[0].Offline, v.GPUs[1].Offline)
	}
	if !strings.Contains(err.Error(), "(0 free on the node)") {
		t.Fatalf("refusal %q does not say the node has nothing free", err)
	}
}

// Readers never take the lease table's lock: the view is there while the
// lock is held.
func TestViewIsReadWithoutTheLock(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	done := make(chan *View)
	go func() { done <- m.View() }()
	select {
	case v := <-done:
		if len(v.Leases()) != 1 {
			t.Fatalf("view has %d leases, want 1", len(v.Leases()))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("View waited for the lease table's lock")
	}
}
