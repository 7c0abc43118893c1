// Package agent is gpuletd: it wires the GPU inventory, the unit model, the
// pipe-file ledger, the lease engine, the API and the snapshot publisher, and
// runs them until its context ends. Each of those parts lives in its own
// package and owns its state; the agent owns only what joins them: the order
// they start and stop in (Run's list), the flags, the node's conditions
// (samples, draining, MPS health) that placement reads, the config in force
// and its reloads, and what the API needs beyond the lease engine (the
// request mix, usage on leases, the dry run). It makes no placement decision
// and keeps no lease.
package agent

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/node"
	"github.com/gpulet/gpulet/agent/profiles"
	"github.com/gpulet/gpulet/agent/reporter"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/internal/lifecycle"
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

	// claimHolders are the processes last found holding each claim FIFO
	// open (accounting.go).
	claimHolders fifoHolders
}

// Run starts gpuletd and serves until ctx ends, then stops cleanly. Parts
// start in dependency order and stop in reverse, through one stack: a part
// that fails to start stops those started before it.
func Run(ctx context.Context, cfg Config) error {
	// SIGHUP would end the process by default; it is the reload signal.
	hangup := make(chan os.Signal, 1)
	signal.Notify(hangup, syscall.SIGHUP)
	defer signal.Stop(hangup)
	log := cfg.Logger
	raiseFileLimit(log)
	b := newBoot(ctx, cfg, hangup)
	parts := &lifecycle.Stack{OnError: func(err error) { log.Error("error while stopping", "err", err) }}
	defer parts.Close()
	err := parts.Start(
		b.openInventory,
		b.readConfig,
		b.lockRunDir,
		b.listenAPI,
		b.openStateDir,
		b.startMPS,
		b.openLedger,
		b.openLeases,
		b.publish,
		b.startBackground,
		b.startReporters,
		b.startView,
		b.startKubelet,
		b.startDRA,
		b.serveAPI,
		b.stopViewFirst,
		b.watchFaults,
		b.serveTCP,
	)
	if err != nil {
		return err
	}
	systemd.Ready()
	snap := b.store.Load().Snapshot
	log.Info("gpuletd ready", "socket", b.ln.Addr().String(), "backend", snap.Backend, "gpus", len(snap.GPUs), "units", snap.UnitsTotal, "run-dir", cfg.RunDir)
	return b.serve(ctx)
}

// serve is the main loop: it samples the GPUs, sweeps the ledger and ticks
// the lease engine every --sample-interval, until ctx ends or an API server
// stops serving.
func (b *boot) serve(ctx context.Context) error {
	ticker := time.NewTicker(b.cfg.SampleInterval)
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
			b.log.Info("gpuletd stopping")
			return nil
		case err := <-b.serveErr:
			return fmt.Errorf("API server: %w", err)
		case <-ticker.C:
			b.sample()
			b.ledger.Sweep()
			b.leases.Tick()
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
	return reporter.NewGroup(cfgs, &a.store)
}

// changed says that the lease table, the samples or a condition changed: the
// next read of the snapshot builds a new one, and waiters on its change wake.
func (a *Agent) changed() { a.store.Invalidate() }
