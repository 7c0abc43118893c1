// Package agent is gpuletd's core: it wires the GPU inventory, the unit model,
// the pipe-file ledger, the lease engine, the API and the snapshot publisher,
// and runs them until its context ends. Each part lives in its own package;
// this file holds only the wiring and the main loop, and the files beside it
// the agent's own small pieces: flags.go (gpuletd's flags), rundir.go (the
// run dir's lock), listen.go (the API socket), limits.go (the open-file
// limit), backend.go (picking the GPU backend), mps.go (MPS daemons and their
// health checks), nodestate.go (samples, and the inputs and outputs of the
// node model, package node: conditions and the snapshot), core.go (what the
// API calls), kube.go (the kubelet plugin's flags and start).
package agent

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/agent/node"
	"github.com/gpulet/gpulet/agent/profiles"
	"github.com/gpulet/gpulet/agent/reporter"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/agent/server"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/internal/memlimit"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/placement"
	"github.com/gpulet/gpulet/snapshot"
	"github.com/gpulet/gpulet/systemd"
)

// Config is what gpuletd's flags set.
type Config struct {
	Socket      string
	SocketGroup string
	RunDir      string
	StateDir    string
	// Mount is the FUSE view's mount point; empty: no view.
	Mount          string
	Backend        Backend
	SimGPUs        SimGPUs
	Model          units.Model
	MaxUtilization int
	Policy         placement.Policy
	SampleInterval time.Duration
	NodeName       string
	AdminGroup     string
	// MPS is whether MPS must, may or must not run; MPSControl the control
	// binary.
	MPS        mpsctl.Mode
	MPSControl string
	// MaxConnsPerUID and MaxWaitersPerUID cap the connections and the
	// requests queued for units of one uid; root is not capped.
	MaxConnsPerUID   int
	MaxWaitersPerUID int
	// PrivateLeases keeps other users' leases out of GET /v1/leases?all=true
	// for callers who are not admins.
	PrivateLeases bool
	// Listen is the TCP address of the read-only endpoints; empty: none.
	Listen string
	// ListenFullDetail serves the snapshot over Listen with its uids and
	// reservation names; without it they are redacted.
	ListenFullDetail bool
	// ListenMaxConns and ListenMaxConnsPerAddr cap the TCP connections
	// open at once over Listen, in all and from one remote address.
	ListenMaxConns, ListenMaxConnsPerAddr int
	// ReclaimGrace is the time between SIGTERM and SIGKILL for a borrower
	// whose units a reservation takes back.
	ReclaimGrace time.Duration
	// Upstreams receive the snapshots every ReportInterval and on change,
	// with the bearer token of UpstreamTokenFile and trusting UpstreamCA.
	Upstreams         []reporter.Upstream
	ReportInterval    time.Duration
	UpstreamTokenFile string
	UpstreamCA        string
	// UpstreamCert and UpstreamKey are the client certificate presented to
	// https upstreams; none when empty.
	UpstreamCert, UpstreamKey string
	// ConfigPath is the --config file (pools, quotas, task profiles); empty:
	// none.
	ConfigPath string
	// Accounting attributes the GPU's processes to leases and claims at
	// every sample (--accounting).
	Accounting bool
	// Kube is the kubelet plugin's configuration.
	Kube KubeConfig
	// NVML is the library the nvml backend uses (nvml.New() in production).
	NVML   nvml.Interface
	Logger *slog.Logger
	// MemoryFloor, when not 0, is the least soft memory limit gpuletd keeps
	// once it serves (memlimit.Keep): it bounds the garbage a slow collector
	// pace leaves beside a large table of leases. 0 leaves the runtime's limit
	// (GOMEMLIMIT) alone.
	MemoryFloor int64
}

// Agent is a running gpuletd.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	inv  inventory.Inventory
	devs []inventory.Device
	// node is the node model (what does not change while gpuletd runs) and
	// builder the snapshot's, which the store calls.
	node    node.Node
	builder *node.Builder
	ledger  *ledger.Ledger
	leases  *lease.Manager
	mps     *mpsctl.Daemons
	mpsOn   bool
	// view is the FUSE view's state, set once mounting was tried.
	view  atomic.Pointer[api.ViewStatus]
	store snapshot.Store
	// reloadFailed says why the last SIGHUP reload failed; nil once one
	// succeeds (policy.go).
	reloadFailed atomic.Pointer[string]

	// conditions is what placement reads: eligibility per GPU and draining.
	// condMu makes each update read and store them as one step.
	conditions atomic.Pointer[lease.Conditions]
	condMu     sync.Mutex
	draining   atomic.Bool

	sampleMu sync.Mutex // guards samples
	samples  []inventory.Sample

	// upstreams push the snapshots to --upstream and publish how that goes.
	upstreams *reporter.Group
	// rules is the --config in force (nil: none); profiles the task–engine
	// affinity table.
	rules    atomic.Pointer[config.Rules]
	profiles *profiles.Store
	// usage accounts for what leases and claims use; nil with accounting off.
	usage *usage.Accountant
	// mix learns the request mix the frag policy weighs; nil under other
	// policies.
	mix *placement.Learner
	// engineMu makes reading the rules and putting their placement engine
	// in force one step, for a reload and for the frag policy's new mixes:
	// neither may put back an engine of rules no longer in force.
	engineMu sync.Mutex
}

// Run starts gpuletd and serves until ctx ends, then stops cleanly. Parts
// start in dependency order and stop in reverse.
func Run(ctx context.Context, cfg Config) (err error) {
	// SIGHUP would end the process by default; it is the reload signal.
	hangup := make(chan os.Signal, 1)
	signal.Notify(hangup, syscall.SIGHUP)
	defer signal.Stop(hangup)
	log := cfg.Logger
	raiseFileLimit(log)
	inv, err := OpenInventory(cfg)
	if err != nil {
		return err
	}
	a := &Agent{cfg: cfg, log: log, inv: inv, devs: inv.Devices()}
	if cfg.Accounting {
		a.usage = usage.New()
	}
	if cfg.Policy == placement.Frag {
		a.mix = placement.NewLearner(nodeMixWindow, nodeMixShapes, nodeMixEvery)
	}
	var closers []func() error
	closers = append(closers, inv.Close)
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil {
				log.Error("error while stopping", "err", cerr)
			}
		}
	}()
	// A config that does not hold stops the start before anything is touched.
	rules, err := a.loadConfig()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	// Before anything touches the run dir, the ledger or the MPS daemons: a
	// second gpuletd must not rewrite the first one's journal or stop its MPS
	// daemons on its way out.
	unlock, err := lockRunDir(cfg.RunDir)
	if err != nil {
		return err
	}
	closers = append(closers, unlock)
	ln, err := a.listen()
	if err != nil {
		return err
	}
	// The API server closes it too on a clean stop; this covers a failed start.
	closers = append(closers, func() error { ln.Close(); return nil })
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	if err := a.openProfiles(); err != nil {
		return err
	}
	if err := a.startMPS(ctx, &closers); err != nil {
		return err
	}
	a.node = node.Node{Name: cfg.NodeName, BootID: newBootID(), Backend: inv.Backend(), MPS: a.mpsOn,
		Model: cfg.Model, MaxUtilization: cfg.MaxUtilization, Devices: a.devs}
	a.builder = node.NewBuilder(&a.node)
	a.samples = make([]inventory.Sample, len(a.devs))
	gpus := make([]ledger.GPU, len(a.devs))
	for i, d := range a.devs {
		gpus[i] = ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name}
	}
	if a.ledger, err = ledger.New(cfg.RunDir, cfg.Model, gpus, ledger.GroupID(cfg.SocketGroup), log); err != nil {
		return err
	}
	// Closed after the lease engine and the watch, which are stopped first.
	closers = append(closers, a.ledger.Close)
	if err := a.ledger.WriteLayout(a.layoutEnv); err != nil {
		return fmt.Errorf("writing layout.json: %w", err)
	}
	a.sample()
	a.leases, err = lease.New(lease.Config{
		Model: cfg.Model, Devices: a.devs, Ledger: a.ledger, MaxWaitersPerUID: cfg.MaxWaitersPerUID,
		JournalPath: filepath.Join(cfg.RunDir, "leases.journal"),
		Policy:      cfg.Policy,
		// What the lease engine takes back at start (pending reservations
		// it admits) is placed by the config's pools already.
		Engine:      a.engineFor(rules),
		Conditions:  a.conditions.Load(),
		OnChange:    a.changed,
		MPS:         a.mpsOn,
		InstanceEnv: a.instanceEnvs(),
		Profiles:    a.profiles,
		TaskRan:     a.taskRan,
		Logger:      log,
		// Reservations survive a reboot: the state dir, not the run dir.
		ReservationsPath: filepath.Join(cfg.StateDir, reserve.FileName),
		ReclaimGrace:     cfg.ReclaimGrace,
		Usage:            a.usage,
	})
	if err != nil {
		return err
	}
	closers = append(closers, a.leases.Close)
	// Replaying the journal leaves its garbage: many times the table's own
	// size with thousands of leases, which the collector's pace (GOGC 400)
	// would keep until much later. It goes back to the system now.
	debug.FreeOSMemory()
	if a.upstreams, err = a.newUpstreams(); err != nil {
		return err
	}
	a.store.SetBuilder(a.buildSnapshot)
	a.applyRules(rules)
	bg, stopBackground := context.WithCancel(context.Background())
	mpsChecked := make(chan struct{})
	closers = append(closers, func() error {
		stopBackground()
		<-mpsChecked
		return nil
	})
	go func() {
		defer close(mpsChecked)
		a.checkMPS(bg, cfg.SampleInterval)
	}()
	usersPublished := make(chan struct{})
	closers = append(closers, func() error {
		stopBackground()
		<-usersPublished
		return nil
	})
	go func() {
		defer close(usersPublished)
		a.publishUsers(bg, cfg.SampleInterval)
	}()
	if cfg.MemoryFloor != 0 {
		// Only now: the journal's replay above makes garbage many times the
		// table's size, which a limit would collect at once, slowing the start.
		memoryKept := make(chan struct{})
		closers = append(closers, func() error {
			stopBackground()
			<-memoryKept
			return nil
		})
		go func() {
			defer close(memoryKept)
			memlimit.Keep(bg, cfg.MemoryFloor, time.Second)
		}()
	}
	if err := a.leases.Watch(bg); err != nil {
		return err
	}
	// SIGHUP reloads on a goroutine of its own: a slow or stuck read of the
	// config path must never stop the main loop's sweep, samples and
	// watchdog pings.
	reloaded := make(chan struct{})
	closers = append(closers, func() error {
		stopBackground()
		<-reloaded
		return nil
	})
	go func() {
		defer close(reloaded)
		a.reloadOnHangup(bg, hangup)
	}()
	a.startReporters(bg, &closers)
	closeView := a.mountView(ln.Addr().String())
	a.changed()
	if err := a.startKubelet(&closers); err != nil {
		if closeView != nil {
			closeView()
		}
		return err
	}

	apiServer := server.New(a, a.adminGID(), log)
	apiServer.Live = metrics.NewLive(a.upstreams.Status)
	apiServer.PrivateLeases = cfg.PrivateLeases
	srv := apiServer.HTTPServer()
	serveErr := make(chan error, 2)
	// Requests run in a context that the stop cancels first, so that long
	// polls and waiting leases end at once rather than hold up the stop
	// (Shutdown waits for requests but does not cancel them).
	requests, cancelRequests := context.WithCancel(context.Background())
	base := func(net.Listener) context.Context { return requests }
	srv.BaseContext = base
	local := server.LimitListener(ln, cfg.MaxConnsPerUID, log)
	go func() { serveErr <- srv.Serve(local) }()
	closers = append(closers, func() error {
		cancelRequests()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return apiServer.Shutdown(sctx, srv)
	})
	if closeView != nil {
		// Closed before the API server: the view process reads through it
		// until it has unmounted.
		closers = append(closers, closeView)
	}

	if n, ok := inv.(*inventory.NVML); ok {
		// A critical Xid takes its GPU out of placement at once.
		n.OnFault(a.sample)
	}
	if cfg.Listen != "" {
		tcp, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		ro := apiServer.ReadOnlyHTTPServer(cfg.ListenFullDetail)
		ro.BaseContext = base
		tcpLimited := server.LimitTCPListener(tcp, cfg.ListenMaxConns, cfg.ListenMaxConnsPerAddr, local, log)
		go func() { serveErr <- ro.Serve(tcpLimited) }()
		closers = append(closers, func() error {
			cancelRequests()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return apiServer.Shutdown(sctx, ro)
		})
		log.Info("serving the read-only endpoints over TCP", "listen", tcp.Addr().String(), "full_detail", cfg.ListenFullDetail,
			"max_conns", cfg.ListenMaxConns, "max_conns_per_addr", cfg.ListenMaxConnsPerAddr)
	}
	systemd.Ready()
	snap := a.store.Load().Snapshot
	log.Info("gpuletd ready", "socket", ln.Addr().String(), "backend", snap.Backend, "gpus", len(snap.GPUs), "units", snap.UnitsTotal, "run-dir", cfg.RunDir)

	ticker := time.NewTicker(cfg.SampleInterval)
	defer ticker.Stop()
	// Each sample round pings the watchdog, as it always has (a notify
	// socket sees the rounds go by), and so does a ticker of its own:
	// --sample-interval may be longer than the unit's WatchdogSec. Both from
	// this loop, so that a loop stuck in a sample pings it no more.
	var watchdog <-chan time.Time
	if d := systemd.WatchdogInterval(); d > 0 {
		wt := time.NewTicker(d)
		defer wt.Stop()
		watchdog = wt.C
	}
	for {
		select {
		case <-ctx.Done():
			systemd.Stopping()
			log.Info("gpuletd stopping")
			return nil
		case err := <-serveErr:
			return fmt.Errorf("API server: %w", err)
		case <-ticker.C:
			a.sample()
			a.ledger.Sweep()
			a.leases.Tick()
			systemd.Watchdog()
		case <-watchdog:
			systemd.Watchdog()
		}
	}
}

// mountView has the view process (viewproc.go) mount the FUSE view and serve
// it from the API at socket, and returns what stops it (nil: no view asked
// for). A view that cannot be mounted is degraded, not fatal: the API serves
// on, and the log and the snapshot say why.
func (a *Agent) mountView(socket string) func() error {
	if a.cfg.Mount == "" {
		return nil
	}
	v := startView(a.cfg.Mount, socket, a.log, func(st *api.ViewStatus) {
		a.view.Store(st)
		a.changed()
	})
	return v.Close
}

func newBootID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// newUpstreams makes a sender per --upstream.
func (a *Agent) newUpstreams() (*reporter.Group, error) {
	var cfgs []reporter.Config
	for _, u := range a.cfg.Upstreams {
		cfgs = append(cfgs, reporter.Config{Upstream: u, Interval: a.cfg.ReportInterval, TokenFile: a.cfg.UpstreamTokenFile,
			CAFile: a.cfg.UpstreamCA, CertFile: a.cfg.UpstreamCert, KeyFile: a.cfg.UpstreamKey, Logger: a.log})
	}
	return reporter.NewGroup(cfgs, a)
}

// startReporters starts pushing to the upstreams, and makes the snapshot,
// which shows whether each push fails, anew when that changes; on its way out
// gpuletd stops them and waits for them.
func (a *Agent) startReporters(ctx context.Context, closers *[]func() error) {
	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	*closers = append(*closers, func() error { stop(); wg.Wait(); return nil })
	wg.Go(func() { a.upstreams.Run(ctx) })
	wg.Go(func() {
		changed := a.upstreams.StateChanged()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				// The next signal is taken before the snapshot is made
				// anew, so that a change meanwhile is not missed.
				changed = a.upstreams.StateChanged()
				a.changed()
			}
		}
	})
}

// changed says that the lease table, the samples or a condition changed: the
// next read of the snapshot builds a new one, and waiters on its change wake.
func (a *Agent) changed() { a.store.Invalidate() }
