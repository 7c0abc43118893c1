package lease

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"os"
	"path/filepath"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
)

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
	if err := m.Release(identity.Peer{UID: root.UID + 1}, l.ID); !errors.Is(err, api.ErrNotFound) {
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
		{"min cc above every GPU, waiting", api.LeaseRequest{Units: 1, MinCC: "9.0", TTL: "1m", Wait: "1h"}, placement.ErrNeverFits,
			"GPU 0 has compute capability 8.0, below the 9.0 asked; GPU 1 has compute capability 7.5, below the 9.0 asked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{LeaseRequest: tc.req}
			req.TTL, _ = time.ParseDuration(tc.req.TTL)
			req.Wait, _ = time.ParseDuration(tc.req.Wait)
			if tc.req.MinCC != "" {
				req.MinCapability, _ = api.ParseComputeCapability(tc.req.MinCC)
			}
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

// The manager gives placement each GPU's card as the inventory reads it (GPU
// 0 an A100-80GB, GPU 1 a T4): min_cc and the score policy see them.
func TestCardsReachPlacement(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) { c.Policy = placement.BestFit })
	// GPU 1 holds a unit: best-fit now prefers it, the score policy the A100.
	if _, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "1"}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil || l.GPU.Index != 1 {
		t.Fatalf("best-fit placed on %+v, %v; want GPU 1", l.GPU, err)
	}
	for _, tc := range []struct {
		name   string
		policy placement.Policy
		minCC  api.ComputeCapability
	}{
		{"best-fit with min_cc 8.0", placement.BestFit, api.ComputeCapability{Major: 8}},
		{"score", placement.Score, api.ComputeCapability{}},
	} {
		m.SetRules(placement.New(tc.policy), nil)
		req := ttlReq(1, "1m")
		req.MinCapability = tc.minCC
		if l, err := m.Acquire(context.Background(), root, req); err != nil || l.GPU.Index != 0 {
			t.Fatalf("%s placed on %+v, %v; want the A100, GPU 0", tc.name, l.GPU, err)
		}
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
	testutil.Eventually(t, "the request queued", func() bool { return waiting(m) == 1 })
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
	// A waiter cancelled while queued leaves nothing either.
	ctx, cancel := context.WithCancel(context.Background())
	req.Wait = time.Minute
	go func() {
		// Not Eventually: a goroutine other than the test's must not end
		// it. A request never queued is cancelled after 10s all the same.
		for start := time.Now(); waiting(m) == 0 && time.Since(start) < 10*time.Second; {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := m.Acquire(ctx, root, req); err == nil {
		t.Fatal("cancelled waiter got a lease")
	}
	if n, w := len(m.View().Leases()), waiting(m); n != 4 || w != 0 {
		t.Fatalf("%d leases and %d requests queued after a cancelled wait, want 4 and 0", n, w)
	}
}

func TestDrainingRefusesNewLeases(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) {
		c.Conditions = &Conditions{Draining: true}
	})
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("draining node: %v", err)
	}
}

func TestIneligibleGPUIsSkippedWithReason(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) {
		c.Conditions = &Conditions{GPUs: []GPUCondition{{Unusable: "is 95% busy"}, {Unusable: "failed: lost"}}}
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
		c.InstanceEnv = mpsFolders(f, "/p")
	})
	l, err := m.Acquire(context.Background(), root, ttlReq(2, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" || l.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/p/"+l.GPU.UUID+"/"+strconv.Itoa(l.Instance) {
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
	alice, bob := identity.Peer{UID: 1001, Admin: true}, identity.Peer{UID: 1002, Admin: true}
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
	_, err = m.Acquire(context.Background(), identity.Peer{UID: 1003, Admin: true}, ttlReq(1, "1m"))
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("third user: %v", err)
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
	// The dry run gives the answer the lease got.
	if _, dryErr := m.Explain(root, bound); dryErr == nil || dryErr.Error() != err.Error() {
		t.Fatalf("dry run of a third unit for one process: %v, want %v", dryErr, err)
	}
	if _, err := m.Explain(root, ttlReq(2, "1m")); err != nil {
		t.Fatalf("dry run of a ttl lease counted the process's units: %v", err)
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

// Something that is no FIFO at a unit's name (here a folder) blocks that unit
// until the ledger's sweep removes it; the grant goes to another unit instead
// of failing.
func TestJunkAtAUnitNameIsPassedOver(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	for g := 0; g < 2; g++ {
		if err := os.Mkdir(filepath.Join(f.ledger.InstanceDir(g, 0), "unit-0"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatalf("grant with a folder at unit-0 of each GPU: %v", err)
	}
	if l.Units[0] == 0 {
		t.Fatalf("granted unit 0, where the folder is")
	}
	f.ledger.Sweep()
	testutil.Eventually(t, "the swept unit free again", func() bool {
		v := m.View()
		return v.GPUs[0].Used+v.GPUs[1].Used == 1
	})
}

// A request waiting for units is served as soon as new conditions let it in,
// not only when units free up.
func TestWaiterIsServedWhenConditionsChange(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	busy := &Conditions{GPUs: []GPUCondition{{Unusable: "is busy", MemoryFreeMiB: 1 << 20}, {Unusable: "is busy", MemoryFreeMiB: 1 << 20}}}
	m := f.manager(t, func(c *Config) { c.Conditions = busy })
	go func() {
		// Not Eventually: a goroutine other than the test's must not end it.
		for waiting(m) == 0 {
			time.Sleep(time.Millisecond)
		}
		m.SetConditions(&Conditions{GPUs: []GPUCondition{{MemoryFreeMiB: 1 << 20}, {MemoryFreeMiB: 1 << 20}}})
	}()
	req := ttlReq(1, "1h")
	req.Wait = time.Minute
	if _, err := m.Acquire(context.Background(), root, req); err != nil {
		t.Fatal(err)
	}
}

// A waiter that gives up is answered with what keeps it out at that moment.
func TestWaitTimeoutSaysWhy(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	busy := &Conditions{GPUs: []GPUCondition{{Unusable: "is 95% busy", MemoryFreeMiB: 1 << 20}, {Unusable: "is 95% busy", MemoryFreeMiB: 1 << 20}}}
	m := f.manager(t, func(c *Config) { c.Conditions = busy })
	req := ttlReq(1, "1h")
	req.Wait = 50 * time.Millisecond
	_, err := m.Acquire(context.Background(), root, req)
	if !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "is 95% busy") || !strings.Contains(err.Error(), "after waiting 50ms") {
		t.Fatalf("err = %v, want insufficient_units saying the GPUs are busy", err)
	}
}

// A swapped engine (a config reload) places the next request.
func TestSetRulesSwapsThePolicy(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t, func(c *Config) { c.Policy = placement.BestFit })
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
	m.SetRules(placement.New(placement.Spread), nil)
	b, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if b.GPU.Index != 1 {
		t.Fatalf("after the swap to spread the second lease went to GPU %d, want 1", b.GPU.Index)
	}
}

// waiting counts the requests queued for units.
func waiting(m *Manager) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}
