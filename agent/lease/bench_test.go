package lease

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// BenchmarkAcquireRelease is the lease engine's part of a lease round trip,
// with the run dir on tmpfs as in production.
func BenchmarkAcquireRelease(b *testing.B) {
	m, ctx := benchManager(b, 64)
	acquireRelease(b, m, ctx, 0)
}

// BenchmarkAcquireReleaseHeld is BenchmarkAcquireRelease on GPUs of 704
// units with 1,250 leases of one unit held all along, as on a large node
// under load (BenchmarkLeaseUnderReaders' api-held=10000 holds 625 a GPU):
// each change builds its GPU's part of the view again, over every unit.
func BenchmarkAcquireReleaseHeld(b *testing.B) {
	m, ctx := benchManager(b, 704)
	acquireRelease(b, m, ctx, 1250)
}

// acquireRelease times b.N leases of one unit and their releases on m, with
// held leases of one unit taken first and kept.
func acquireRelease(b *testing.B, m *Manager, ctx context.Context, held int) {
	req := ttlReq(1, "1h")
	for range held {
		if _, err := m.Acquire(ctx, root, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := m.Acquire(ctx, root, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(root, l.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// benchManager is a Manager of two simulated A100s of unitsPerGPU units
// each (one instance of as many clients), with its run dir on tmpfs as in
// production; mutate changes its config (a fake clock, a policy).
func benchManager(b *testing.B, unitsPerGPU int, mutate ...func(*Config)) (*Manager, context.Context) {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "gpulet-lease-bench-")
	if err != nil {
		b.Skip("no tmpfs at /dev/shm:", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	model, err := units.New(1, unitsPerGPU, 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	devs := inventory.NewSim("bench", []inventory.Model{inventory.Models[5], inventory.Models[5]}).Devices()
	var gpus []ledger.GPU
	for _, d := range devs {
		gpus = append(gpus, ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name})
	}
	led, err := ledger.New(dir, model, gpus, -1, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Model: model, Devices: devs, Ledger: led, JournalPath: filepath.Join(dir, "leases.journal"), Policy: placement.BestFit, Logger: quietLog()}
	for _, fn := range mutate {
		fn(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(func() { cancel(); m.Close() })
	if err := m.Watch(ctx); err != nil {
		b.Fatal(err)
	}
	return m, ctx
}

// benchRules are a large site's config: 50 pools over the two GPUs, each
// naming 20 users and 5 groups, and 1,000 quotas; the caller is in one pool
// through a group and has quotas of its own, of a group and of everyone.
func benchRules() ([]placement.Pool, []config.Quota) {
	pools := make([]placement.Pool, 50)
	for i := range pools {
		p := placement.Pool{Name: fmt.Sprintf("pool%02d", i), GPUs: []int{i % 2}}
		for u := range 20 {
			p.UIDs = append(p.UIDs, uint32(2000+i*20+u))
		}
		for g := range 5 {
			p.GIDs = append(p.GIDs, uint32(5000+i*5+g))
		}
		pools[i] = p
	}
	quotas := make([]config.Quota, 0, 1000)
	for u := range 997 {
		quotas = append(quotas, config.Quota{Key: fmt.Sprint(3000 + u), Kind: identity.User, ID: uint32(3000 + u), Limit: 8})
	}
	quotas = append(quotas,
		config.Quota{Key: "1001", Kind: identity.User, ID: 1001, Limit: 1 << 20},
		config.Quota{Key: "group:5017", Kind: identity.Group, ID: 5017, Limit: 1 << 20},
		config.Quota{Key: "*", Kind: identity.Everyone, Limit: 1 << 20})
	return pools, quotas
}

// BenchmarkConfiguredLease compares a lease and its release by a caller who
// is no admin on a Manager with benchRules in force against the same on a
// Manager without a config, in alternating turns (paired, so that the
// machine's drift falls on both alike). Reported: ns/op of each side and
// x-plain, configured against plain. Goal: within 10% (x-plain ≤ 1.1). This
// is the lease engine's part of a round trip, where pools and quotas cost;
// the socket and HTTP add the same to both sides, so the ratio of whole
// round trips is closer to 1 still.
func BenchmarkConfiguredLease(b *testing.B) {
	plain, ctx := benchManager(b, 64)
	configured, _ := benchManager(b, 64)
	pools, quotas := benchRules()
	configured.SetRules(placement.New(placement.BestFit).WithPools(pools), NewQuotas(quotas))
	caller := identity.Peer{UID: 1001, GID: 1001, Groups: []uint32{5017, 7, 8}}
	req := ttlReq(1, "1m")
	op := func(m *Manager) {
		l, err := m.Acquire(ctx, caller, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(caller, l.ID); err != nil {
			b.Fatal(err)
		}
	}
	const turn = 50
	var elapsed [2]time.Duration
	sides := [2]*Manager{plain, configured}
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; done, round = done+turn, round+1 {
		n := min(turn, b.N-done)
		for k := range 2 {
			side := (k + round) % 2
			start := time.Now()
			for range n {
				op(sides[side])
			}
			elapsed[side] += time.Since(start)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(elapsed[0].Nanoseconds())/float64(b.N), "plain-ns/op")
	b.ReportMetric(float64(elapsed[1].Nanoseconds())/float64(b.N), "configured-ns/op")
	b.ReportMetric(float64(elapsed[1])/float64(elapsed[0]), "x-plain")
}
