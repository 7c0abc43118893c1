package lease

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/placement"
	"github.com/gpulet/gpulet/agent/units"
)

// BenchmarkAcquireRelease is the lease engine's part of a lease round trip,
// with the run dir on tmpfs as in production.
func BenchmarkAcquireRelease(b *testing.B) {
	dir, err := os.MkdirTemp("/dev/shm", "gpulet-lease-bench-")
	if err != nil {
		b.Skip("no tmpfs at /dev/shm:", err)
	}
	defer os.RemoveAll(dir)
	model, _ := units.New(1, 64, 1, 0)
	devs := inventory.NewSim("bench", []inventory.Model{inventory.Models[5], inventory.Models[5]}).Devices()
	var gpus []ledger.GPU
	for _, d := range devs {
		gpus = append(gpus, ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name})
	}
	led, err := ledger.New(dir, model, gpus, -1, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(Config{Model: model, Devices: devs, Ledger: led, JournalPath: filepath.Join(dir, "leases.journal"), Policy: placement.BestFit, Logger: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Watch(ctx); err != nil {
		b.Fatal(err)
	}
	req := ttlReq(1, "1m")
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
