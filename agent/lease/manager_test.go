package lease

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
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

// fixtureAt is a fixture whose run dir is dir, with two GPUs of different
// models.
func fixtureAt(t *testing.T, dir string, model units.Model) *fixture {
	t.Helper()
	return fixtureOf(t, dir, model, inventory.Models[5], inventory.Models[0])
}

// fixtureOf is a fixture whose run dir is dir, with simulated GPUs of models.
func fixtureOf(t *testing.T, dir string, model units.Model, models ...inventory.Model) *fixture {
	t.Helper()
	sim := inventory.NewSim("test", models)
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

// root is an admin whose process is the test's own, of the user the test
// runs as (root in CI): leases bound to its process (or a child's) must be
// of its owner, as the kernel's credentials would say.
var root = identity.Peer{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: os.Getpid(), Admin: true}
