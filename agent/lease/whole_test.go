package lease

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
	"golang.org/x/sys/unix"
)

// newWholeFixture is a node of four alike GPUs.
func newWholeFixture(t *testing.T) *fixture {
	t.Helper()
	model, err := units.New(1, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	t4 := inventory.Models[0]
	return fixtureOf(t, runDir(t), model, t4, t4, t4, t4)
}

func wholeReq(n int, ttl string) Request {
	r := Request{LeaseRequest: api.LeaseRequest{GPUs: n, TTL: ttl}}
	r.TTL, _ = time.ParseDuration(ttl)
	return r
}

// usedUnits is the units the view shows used on each GPU, and the FIFOs of
// each on disk.
func usedUnits(t *testing.T, f *fixture, m *Manager) (used, fifos []int) {
	t.Helper()
	v := m.View()
	for g := range f.devs {
		used = append(used, v.GPUs[g].Used)
		fifos = append(fifos, f.fifoCount(t, g))
	}
	return used, fifos
}

func TestWholeGPULease(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	l, err := m.Acquire(context.Background(), root, wholeReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	u := f.model.UnitsPerGPU
	if len(l.GPUs) != 2 || l.GPU != l.GPUs[0] || l.Instance != 0 || len(l.Units) != u {
		t.Fatalf("lease %+v", l)
	}
	want := l.GPUs[0].UUID + "," + l.GPUs[1].UUID
	if len(l.Env) != 1 || l.Env["CUDA_VISIBLE_DEVICES"] != want {
		t.Fatalf("env %v, want only CUDA_VISIBLE_DEVICES=%s", l.Env, want)
	}
	if !strings.Contains(string(l.JSON), `"gpus":[`) {
		t.Fatalf("answer %s lists no gpus", l.JSON)
	}
	used, fifos := usedUnits(t, f, m)
	for _, g := range l.GPUs {
		if used[g.Index] != u || fifos[g.Index] != u {
			t.Fatalf("GPU %d: %d used, %d FIFOs; want %d", g.Index, used[g.Index], fifos[g.Index], u)
		}
	}
	if n := len(m.View().Leases()); n != 1 {
		t.Fatalf("%d leases listed, want 1", n)
	}
	if n := m.View().LeaseCount(); n != 1 {
		t.Fatalf("%d leases counted, want 1", n)
	}
	if err := m.Release(root, l.ID); err != nil {
		t.Fatal(err)
	}
	if used, fifos := usedUnits(t, f, m); sum(used)+sum(fifos) != 0 {
		t.Fatalf("after release: used %v, FIFOs %v", used, fifos)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// TestWholeGPUsAreAllOrNothing: a GPU with one unit leased is not whole, a
// request for more whole GPUs than are free takes none, one for more than
// the node has can never fit, and a waiter takes nothing until enough GPUs
// are whole.
func TestWholeGPUsAreAllOrNothing(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	u := f.model.UnitsPerGPU
	ctx := context.Background()
	one, err := m.Acquire(ctx, root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, root, wholeReq(4, "1m")); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "is not whole") {
		t.Fatalf("4 whole GPUs beside a lease: %v", err)
	}
	if _, err := m.Acquire(ctx, root, wholeReq(5, "1m")); !errors.Is(err, placement.ErrNeverFits) {
		t.Fatalf("5 whole GPUs of 4: %v", err)
	}
	if used, _ := usedUnits(t, f, m); sum(used) != 1 {
		t.Fatalf("a refused request took units: %v", used)
	}
	two, err := m.Acquire(ctx, root, wholeReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range two.GPUs {
		if g.Index == one.GPU.Index {
			t.Fatalf("whole-GPU lease on GPU %d, which a unit lease holds", g.Index)
		}
	}
	// Three whole GPUs wait as a whole: one is free now, but nothing is
	// taken until three are.
	var wg sync.WaitGroup
	var got Grant
	var waitErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := wholeReq(3, "1m")
		r.Wait = 10 * time.Second
		got, waitErr = m.Acquire(ctx, root, r)
	}()
	testutil.Eventually(t, "the whole-GPU request waiting", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.waiters) == 1
	})
	if used, _ := usedUnits(t, f, m); sum(used) != 2*u+1 {
		t.Fatalf("a waiting request took units: %v", used)
	}
	if err := m.Release(root, two.ID); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if waitErr != nil || len(got.GPUs) != 3 || got.GPU.Index == one.GPU.Index {
		t.Fatalf("waiter: %+v, %v", got, waitErr)
	}
}

func TestWholeGPUsCountEveryUnitAgainstQuotas(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	u := f.model.UnitsPerGPU
	m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "alice", Kind: identity.User, ID: 1000, Limit: 2 * u}}))
	alice := identity.Peer{UID: 1000, GID: 1000}
	ctx := context.Background()
	if _, err := m.Acquire(ctx, alice, wholeReq(3, "1m")); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("3 whole GPUs under a quota of 2: %v", err)
	}
	if _, err := m.Acquire(ctx, alice, wholeReq(2, "1m")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, alice, ttlReq(1, "1m")); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("a unit beyond 2 whole GPUs under a quota of 2: %v", err)
	}
}

func TestWholeGPUsOnlyFromTheCallersPools(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	pools := []placement.Pool{{Name: "mine", GPUs: []int{1, 3}, Set: identity.Set{UIDs: []uint32{1000}}}, {Name: "theirs", GPUs: []int{0, 2}, Set: identity.Set{UIDs: []uint32{1001}}}}
	m.SetRules(placement.New(placement.BestFit).WithPools(pools), nil)
	alice := identity.Peer{UID: 1000, GID: 1000}
	ctx := context.Background()
	if _, err := m.Acquire(ctx, alice, wholeReq(3, "1m")); !errors.Is(err, placement.ErrNeverFits) {
		t.Fatalf("3 whole GPUs with 2 in the caller's pools: %v", err)
	}
	l, err := m.Acquire(ctx, alice, wholeReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if l.GPUs[0].Index != 1 || l.GPUs[1].Index != 3 {
		t.Fatalf("GPUs %v, want 1 and 3", l.GPUs)
	}
}

// TestWholeGPULeaseOutlivesARestartAndEndsWithItsProcess: the journal keeps
// the GPU list; the holder's exit frees every unit of every GPU at once.
func TestWholeGPULeaseOutlivesARestartAndEndsWithItsProcess(t *testing.T) {
	f := newWholeFixture(t)
	m1 := f.manager(t)
	holder := exec.Command("sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	l, err := m1.Acquire(context.Background(), identity.Peer{UID: root.UID, PID: holder.Process.Pid, Admin: true}, Request{LeaseRequest: api.LeaseRequest{GPUs: 3}})
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()
	m2 := f.manager(t)
	got, err := m2.Get(root, l.ID)
	if err != nil || len(got.GPUs) != 3 || got.Env["CUDA_VISIBLE_DEVICES"] != l.Env["CUDA_VISIBLE_DEVICES"] {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
	if used, fifos := usedUnits(t, f, m2); sum(used) != 3*f.model.UnitsPerGPU || sum(fifos) != 3*f.model.UnitsPerGPU {
		t.Fatalf("after restart: used %v, FIFOs %v", used, fifos)
	}
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "every unit back with the holder's exit", func() bool {
		used, fifos := usedUnits(t, f, m2)
		return sum(used) == 0 && sum(fifos) == 0
	})
}

func TestWholeGPUDryRun(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	p, err := m.Explain(root, wholeReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.GPUs) != 2 || p.GPU != p.GPUs[0] || len(p.Units) != f.model.UnitsPerGPU {
		t.Fatalf("dry run %+v", p)
	}
	if used, _ := usedUnits(t, f, m); sum(used) != 0 {
		t.Fatalf("the dry run took units: %v", used)
	}
}

// TestAnOfflineClaimKeepsItsGPUFromWholeLeases: one claimed unit makes its GPU
// not whole.
func TestAnOfflineClaimKeepsItsGPUFromWholeLeases(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	fd := claimOffline(t, f, 2, 5)
	defer unix.Close(fd)
	testutil.Eventually(t, "the claim counted", func() bool { return m.View().GPUs[2].Offline == 1 })
	ctx := context.Background()
	if _, err := m.Acquire(ctx, root, wholeReq(4, "1m")); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "GPU 2 is not whole") {
		t.Fatalf("4 whole GPUs beside a claim: %v", err)
	}
	l, err := m.Acquire(ctx, root, wholeReq(3, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range l.GPUs {
		if g.Index == 2 {
			t.Fatalf("whole-GPU lease %v on the claimed GPU", l.GPUs)
		}
	}
	if used, fifos := usedUnits(t, f, m); used[2] != 1 || fifos[2] != 1 {
		t.Fatalf("claimed GPU: %d used, %d FIFOs; want the claim alone", used[2], fifos[2])
	}
}

// TestWholeGPUFIFOsAreAllOrNone: a claimer first to one unit while a grant
// makes its FIFOs leaves no FIFO of the grant on any of its GPUs.
func TestWholeGPUFIFOsAreAllOrNone(t *testing.T) {
	f := newWholeFixture(t)
	m := f.manager(t)
	m.mu.Lock()
	fd := claimOffline(t, f, 1, 3)
	defer unix.Close(fd)
	retry, err := m.fifos.createWholeLocked([]int{0, 1})
	m.mu.Unlock()
	if !retry || err != nil {
		t.Fatalf("retry %v, err %v; want a retry", retry, err)
	}
	if n0, n1 := f.fifoCount(t, 0), f.fifoCount(t, 1); n0 != 0 || n1 != 1 {
		t.Fatalf("FIFOs left: %d on GPU 0, %d on GPU 1; want only the claim's", n0, n1)
	}
}
