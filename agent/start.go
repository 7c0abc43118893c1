package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/agent/node"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/agent/server"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/internal/lifecycle"
	"github.com/gpulet/gpulet/internal/memlimit"
	"github.com/gpulet/gpulet/placement"
)

// boot is the agent while it starts: what one start step hands the next, and
// what Run's loop reads once it serves. Each step below is a lifecycle.Step:
// it starts one part and pushes what stops it.
type boot struct {
	*Agent
	// ctx is Run's: starting the MPS daemons is bound by it.
	ctx    context.Context
	hangup <-chan os.Signal
	// rules are the --config read at start (nil: none).
	rules *config.Rules
	// ln is the API socket's listener; local the same under the per-uid
	// connection caps.
	ln, local net.Listener
	// bg is the background work's context; stopBackground ends all of it.
	bg             context.Context
	stopBackground context.CancelFunc
	// closeView stops the FUSE view (nil: none); it runs once.
	closeView func() error
	api       *server.Server
	// requests is the context requests run in, which the stop cancels first,
	// so that long polls and waiting leases end at once rather than hold up
	// the stop (Shutdown waits for requests but does not cancel them).
	requests       context.Context
	cancelRequests context.CancelFunc
	// serveErr is where the API servers say why they stopped serving.
	serveErr chan error
}

func newBoot(ctx context.Context, cfg Config, hangup <-chan os.Signal) *boot {
	b := &boot{Agent: &Agent{cfg: cfg, log: cfg.Logger}, ctx: ctx, hangup: hangup, serveErr: make(chan error, 2)}
	b.bg, b.stopBackground = context.WithCancel(context.Background())
	b.requests, b.cancelRequests = context.WithCancel(context.Background())
	return b
}

// openInventory opens the GPU backend.
func (b *boot) openInventory(s *lifecycle.Stack) error {
	inv, err := OpenInventory(b.cfg)
	if err != nil {
		return err
	}
	b.inv, b.devs = inv, inv.Devices()
	if b.cfg.Accounting {
		b.usage = usage.New()
	}
	if b.cfg.Policy == placement.Frag {
		b.mix = placement.NewLearner(nodeMixWindow, nodeMixShapes, nodeMixEvery)
	}
	s.Push(inv.Close)
	return nil
}

// readConfig reads --config: a config that does not hold stops the start
// before anything is touched.
func (b *boot) readConfig(*lifecycle.Stack) error {
	var err error
	b.rules, err = b.loadConfig()
	return err
}

// lockRunDir makes the run dir and takes its lock, before anything touches
// the run dir, the ledger or the MPS daemons: a second gpuletd must not
// rewrite the first one's journal or stop its MPS daemons on its way out.
func (b *boot) lockRunDir(s *lifecycle.Stack) error {
	if err := os.MkdirAll(b.cfg.RunDir, 0o755); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	unlock, err := lockRunDir(b.cfg.RunDir)
	if err != nil {
		return err
	}
	s.Push(unlock)
	return nil
}

// listenAPI makes the API socket.
func (b *boot) listenAPI(s *lifecycle.Stack) error {
	ln, err := b.listen()
	if err != nil {
		return err
	}
	b.ln = ln
	// The API server closes it too on a clean stop; this covers a failed start.
	s.Push(func() error { ln.Close(); return nil })
	return nil
}

// openStateDir makes the state dir and opens the task profiles kept there.
func (b *boot) openStateDir(s *lifecycle.Stack) error {
	if err := os.MkdirAll(b.cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	if err := b.openProfiles(); err != nil {
		return err
	}
	// Closed after the leases: their last runs are recorded, then written.
	s.Push(b.profiles.Close)
	return nil
}

// openLedger makes the node model and the pipe-file ledger, and writes
// layout.json.
func (b *boot) openLedger(s *lifecycle.Stack) error {
	cfg := b.cfg
	b.node = node.Node{Name: cfg.NodeName, BootID: newBootID(), Backend: b.inv.Backend(), MPS: b.mpsOn,
		Model: cfg.Model, MaxUtilization: cfg.MaxUtilization, Devices: b.devs}
	b.builder = node.NewBuilder(&b.node)
	b.samples = make([]inventory.Sample, len(b.devs))
	gpus := make([]ledger.GPU, len(b.devs))
	for i, d := range b.devs {
		gpus[i] = ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name}
	}
	var err error
	if b.ledger, err = ledger.New(cfg.RunDir, cfg.Model, gpus, ledger.GroupID(cfg.SocketGroup), b.log); err != nil {
		return err
	}
	// Closed after the lease engine and the watch, which are stopped first.
	s.Push(b.ledger.Close)
	if err := b.ledger.WriteLayout(b.layoutEnv); err != nil {
		return fmt.Errorf("writing layout.json: %w", err)
	}
	return nil
}

// openLeases takes the first sample, which the lease engine's conditions
// start from, and opens the lease engine, which takes back its journal.
func (b *boot) openLeases(s *lifecycle.Stack) error {
	b.sample()
	cfg := b.cfg
	var err error
	b.leases, err = lease.New(lease.Config{
		Model: cfg.Model, Devices: b.devs, Ledger: b.ledger, MaxWaitersPerUID: cfg.MaxWaitersPerUID,
		JournalPath: filepath.Join(cfg.RunDir, "leases.journal"),
		Policy:      cfg.Policy,
		// What the lease engine takes back at start (pending reservations
		// it admits) is placed by the config's pools already.
		Engine:      b.engineFor(b.rules),
		Conditions:  b.conditions.Load(),
		OnChange:    b.changed,
		MPS:         b.mpsOn,
		InstanceEnv: b.instanceEnvs(),
		Profiles:    b.profiles,
		TaskRan:     b.taskRan,
		Logger:      b.log,
		// Reservations survive a reboot: the state dir, not the run dir.
		ReservationsPath: filepath.Join(cfg.StateDir, reserve.FileName),
		ReclaimGrace:     cfg.ReclaimGrace,
		Usage:            b.usage,
	})
	if err != nil {
		return err
	}
	s.Push(b.leases.Close)
	// Replaying the journal leaves its garbage: many times the table's own
	// size with thousands of leases, which the collector's pace (GOGC 400)
	// would keep until much later. It goes back to the system now.
	debug.FreeOSMemory()
	return nil
}

// publish makes the upstreams' senders and the snapshot's builder, and puts
// the config read at start in force.
func (b *boot) publish(*lifecycle.Stack) error {
	var err error
	if b.upstreams, err = b.newUpstreams(); err != nil {
		return err
	}
	b.store.SetBuilder(b.buildSnapshot)
	b.applyRules(b.rules)
	return nil
}

// startBackground starts the background work on goroutines of their own,
// which a stop ends and waits for: the MPS health checks, the publishing of
// each instance's users, the memory floor, the lease engine's watch, and the
// reloads at SIGHUP.
func (b *boot) startBackground(s *lifecycle.Stack) error {
	interval := b.cfg.SampleInterval
	s.Go(b.stopBackground, func() { b.checkMPS(b.bg, interval) })
	s.Go(b.stopBackground, func() { b.publishUsers(b.bg, interval) })
	if b.cfg.MemoryFloor != 0 {
		// Only now: the journal's replay makes garbage many times the
		// table's size, which a limit would collect at once, slowing the
		// start.
		s.Go(b.stopBackground, func() { memlimit.Keep(b.bg, b.cfg.MemoryFloor, time.Second) })
	}
	if err := b.leases.Watch(b.bg); err != nil {
		return err
	}
	// SIGHUP reloads on a goroutine of its own: a slow or stuck read of the
	// config path must never stop the main loop's sweep, samples and
	// watchdog pings.
	s.Go(b.stopBackground, func() { b.reloadOnHangup(b.bg, b.hangup) })
	return nil
}

// startReporters starts pushing to the upstreams, and makes the snapshot,
// which shows whether each push fails, anew when that changes; on its way out
// gpuletd stops them and waits for them.
func (b *boot) startReporters(s *lifecycle.Stack) error {
	ctx, stop := context.WithCancel(b.bg)
	var wg sync.WaitGroup
	s.Push(func() error { stop(); wg.Wait(); return nil })
	// Taken before the senders start: a first push that fails before the
	// watcher below asked would otherwise change the state unseen, and the
	// snapshot would not say so until the next change.
	changed := b.upstreams.StateChanged()
	wg.Go(func() { b.upstreams.Run(ctx) })
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				// The next signal is taken before the snapshot is made
				// anew, so that a change meanwhile is not missed.
				changed = b.upstreams.StateChanged()
				b.changed()
			}
		}
	})
	return nil
}

// startView has the view process mount the FUSE view, when one is asked
// for, and makes the first snapshot.
func (b *boot) startView(s *lifecycle.Stack) error {
	if c := b.mountView(b.ln.Addr().String()); c != nil {
		// Pushed here for a start that fails later, which stops the view
		// first and says nothing of how that went; a clean stop closes it
		// where stopViewFirst pushes it, and logs its error.
		b.closeView = lifecycle.Once(c)
		s.Push(func() error { b.closeView(); return nil })
	}
	b.changed()
	return nil
}

// serveAPI serves the API on its socket.
func (b *boot) serveAPI(s *lifecycle.Stack) error {
	b.api = server.New(server.Parts{Snapshots: &b.store, Leases: b.leases, SlurmJobs: b.leases.SlurmJobs(), Reservations: b.leases.Reservations(), Core: b.Agent, SimGPU: b.simGPU()}, b.adminGID(), b.log)
	b.api.Live = metrics.NewLive(b.upstreams.Status)
	b.api.PrivateLeases = b.cfg.PrivateLeases
	srv := b.api.HTTPServer()
	srv.BaseContext = b.baseContext
	b.local = server.LimitListener(b.ln, b.cfg.MaxConnsPerUID, b.log)
	go func() { b.serveErr <- srv.Serve(b.local) }()
	s.Push(func() error { return b.shutdown(srv) })
	return nil
}

func (b *boot) baseContext(net.Listener) context.Context { return b.requests }

// shutdown cancels the requests under way and stops srv.
func (b *boot) shutdown(srv *http.Server) error {
	b.cancelRequests()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return b.api.Shutdown(sctx, srv)
}

// stopViewFirst has a clean stop close the view before the API server: the
// view process reads through it until it has unmounted.
func (b *boot) stopViewFirst(s *lifecycle.Stack) error {
	if b.closeView != nil {
		s.Push(b.closeView)
	}
	return nil
}

// watchFaults has a critical Xid take its GPU out of placement at once.
func (b *boot) watchFaults(*lifecycle.Stack) error {
	b.inv.OnFault(b.sample)
	return nil
}

// serveTCP serves the read-only endpoints over --listen, when it is set.
func (b *boot) serveTCP(s *lifecycle.Stack) error {
	cfg := b.cfg
	if cfg.Listen == "" {
		return nil
	}
	tcp, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	ro := b.api.ReadOnlyHTTPServer(cfg.ListenFullDetail)
	ro.BaseContext = b.baseContext
	tcpLimited := server.LimitTCPListener(tcp, cfg.ListenMaxConns, cfg.ListenMaxConnsPerAddr, b.local, b.log)
	go func() { b.serveErr <- ro.Serve(tcpLimited) }()
	s.Push(func() error { return b.shutdown(ro) })
	b.log.Info("serving the read-only endpoints over TCP", "listen", tcp.Addr().String(), "full_detail", cfg.ListenFullDetail,
		"max_conns", cfg.ListenMaxConns, "max_conns_per_addr", cfg.ListenMaxConnsPerAddr)
	return nil
}
