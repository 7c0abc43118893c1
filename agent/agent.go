// Package agent is gpuletd's core: it wires the GPU inventory, the unit model,
// the pipe-file ledger, the lease engine, the API and the snapshot publisher,
// and runs them until its context ends. Each part lives in its own package;
// this one owns only the wiring and the published snapshot.
package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/agent/placement"
	"github.com/gpulet/gpulet/agent/server"
	"github.com/gpulet/gpulet/agent/snapshot"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/fsview"
	"github.com/gpulet/gpulet/mpsctl"
)

// Config is what gpuletd's flags set.
type Config struct {
	Socket      string
	SocketGroup string
	RunDir      string
	StateDir    string
	// Mount is the FUSE view's mount point; empty: no view.
	Mount          string
	Backend        string // "auto", "nvml" or "sim"
	SimGPUs        string
	Model          units.Model
	MaxUtilization int
	Policy         placement.Policy
	SampleInterval time.Duration
	NodeName       string
	AdminGroup     string
	// MPS is "on", "off" or "auto"; MPSControl the control binary.
	MPS        string
	MPSControl string
	// MaxConnsPerUID and MaxWaitersPerUID cap the connections and the
	// requests queued for units of one uid; root is not capped.
	MaxConnsPerUID   int
	MaxWaitersPerUID int
	// NVML is the library the nvml backend uses (nvml.New() in production).
	NVML   nvml.Interface
	Logger *slog.Logger
}

// Agent is a running gpuletd.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	inv    inventory.Inventory
	devs   []inventory.Device
	ledger *ledger.Ledger
	leases *lease.Manager
	mps    *mpsctl.Daemons
	mpsOn  bool
	// view is the FUSE view's state, set once mounting was tried.
	view   atomic.Pointer[api.ViewStatus]
	store  snapshot.Store
	bootID string

	// conditions is what placement reads: eligibility per GPU and draining.
	conditions atomic.Pointer[lease.Conditions]
	draining   atomic.Bool

	sampleMu sync.Mutex // guards samples
	samples  []inventory.Sample

	// seq numbers the snapshots; only the store's builder, which never runs
	// concurrently, touches it.
	seq uint64
}

// OpenInventory picks the backend: NVML when asked or when it initializes under
// "auto", else the simulated backend, said loudly.
func OpenInventory(cfg Config) (inventory.Inventory, error) {
	sim := func() (inventory.Inventory, error) {
		models, err := inventory.ParseSimSpec(cfg.SimGPUs)
		if err != nil {
			return nil, err
		}
		return inventory.NewSim(cfg.NodeName, models), nil
	}
	switch cfg.Backend {
	case "sim":
		return sim()
	case "nvml":
		return inventory.NewNVML(cfg.NVML)
	case "auto":
		inv, err := inventory.NewNVML(cfg.NVML)
		if err == nil {
			return inv, nil
		}
		s, serr := sim()
		if serr != nil {
			return nil, serr
		}
		cfg.Logger.Warn("NVML is not usable, so gpuletd runs the SIMULATED backend: its GPUs are not real", "why", err.Error(), "sim-gpus", cfg.SimGPUs)
		return s, nil
	}
	return nil, fmt.Errorf("--backend %q: must be auto, nvml or sim", cfg.Backend)
}

// Run starts gpuletd and serves until ctx ends, then stops cleanly.
func Run(ctx context.Context, cfg Config) (err error) {
	log := cfg.Logger
	raiseFileLimit(log)
	inv, err := OpenInventory(cfg)
	if err != nil {
		return err
	}
	a := &Agent{cfg: cfg, log: log, inv: inv, devs: inv.Devices(), bootID: newBootID()}
	var closers []func() error
	closers = append(closers, inv.Close)
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil {
				log.Error("error while stopping", "err", cerr)
			}
		}
	}()
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
	if err := a.startMPS(ctx, &closers); err != nil {
		return err
	}
	a.samples = make([]inventory.Sample, len(a.devs))
	gpus := make([]ledger.GPU, len(a.devs))
	for i, d := range a.devs {
		gpus[i] = ledger.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name}
	}
	if a.ledger, err = ledger.New(cfg.RunDir, cfg.Model, gpus, log); err != nil {
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
		Conditions:  a.conditions.Load,
		OnChange:    a.changed,
		MPS:         a.mpsOn,
		InstanceEnv: func(g, k int) map[string]string { return a.mps.Env(a.devs[g].UUID, k) },
		Logger:      log,
	})
	if err != nil {
		return err
	}
	closers = append(closers, a.leases.Close)
	a.store.SetBuilder(a.buildSnapshot)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	closers = append(closers, func() error { stopWatch(); return nil })
	if err := a.leases.Watch(watchCtx); err != nil {
		return err
	}
	a.mountView(&closers)
	a.changed()

	srv := server.New(a, a.adminGID(), log).HTTPServer()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(server.LimitListener(ln, cfg.MaxConnsPerUID, log)) }()
	closers = append(closers, func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})

	daemon.SdNotify(false, daemon.SdNotifyReady)
	snap := a.store.Load().Snapshot
	log.Info("gpuletd ready", "socket", ln.Addr().String(), "backend", snap.Backend, "gpus", len(snap.GPUs), "units", snap.UnitsTotal, "run-dir", cfg.RunDir)

	ticker := time.NewTicker(cfg.SampleInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			daemon.SdNotify(false, daemon.SdNotifyStopping)
			log.Info("gpuletd stopping")
			return nil
		case err := <-serveErr:
			return fmt.Errorf("API server: %w", err)
		case <-ticker.C:
			a.mps.Check(ctx)
			a.sample()
			a.leases.Tick()
			a.changed()
			daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		}
	}
}

// mountView mounts the FUSE view. A view that cannot be mounted is degraded,
// not fatal: the API serves on, and the log and the snapshot say why.
func (a *Agent) mountView(closers *[]func() error) {
	if a.cfg.Mount == "" {
		return
	}
	st := &api.ViewStatus{Mount: a.cfg.Mount}
	v, err := fsview.Mount(a.cfg.Mount, &a.store, fsview.Options{Logger: a.log})
	if err != nil {
		st.Error = err.Error()
		a.log.Warn("the FUSE view is not available; the API serves on without it", "err", err)
	} else {
		st.Mounted = true
		*closers = append(*closers, v.Close)
	}
	a.view.Store(st)
	a.changed()
}

// lockRunDir takes an exclusive lock on <run-dir>/gpuletd.lock for the life of
// the daemon, so that two daemons never share a ledger and a journal.
func lockRunDir(runDir string) (func() error, error) {
	path := filepath.Join(runDir, "gpuletd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--run-dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another gpuletd is already running with --run-dir %s", runDir)
		}
		return nil, fmt.Errorf("--run-dir: locking %s: %w", path, err)
	}
	return f.Close, nil
}

func mpsMode(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func newBootID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// startMPS resolves --mps and brings up the control daemons (a null manager
// when MPS is off). Instances that fail to start are down and retried by the
// health pass; only a configuration error stops gpuletd.
func (a *Agent) startMPS(ctx context.Context, closers *[]func() error) error {
	path, on, err := mpsctl.Resolve(a.cfg.MPS, a.cfg.MPSControl)
	if err != nil {
		return err
	}
	if on && a.cfg.Model.InstancesPerGPU > 1 {
		if err := a.checkComputeModes(); err != nil {
			return err
		}
	}
	runDir, err := filepath.Abs(a.cfg.RunDir)
	if err != nil {
		return err
	}
	uuids := make([]string, len(a.devs))
	for i, d := range a.devs {
		uuids[i] = d.UUID
	}
	a.mps, err = mpsctl.New(mpsctl.Config{Control: path, RunDir: runDir, InstancesPerGPU: a.cfg.Model.InstancesPerGPU, Logger: a.log}, uuids)
	if err != nil {
		return err
	}
	a.mpsOn = on
	*closers = append(*closers, a.mps.Close)
	if !on {
		a.log.Info("MPS is off: leases carry no MPS variables", "mps", a.cfg.MPS)
		return nil
	}
	if err := a.mps.Start(ctx); err != nil {
		a.log.Error("some MPS control daemons did not start; their GPUs are degraded and they are retried", "err", err)
	}
	return nil
}

// checkComputeModes refuses several MPS servers per GPU where the compute mode
// admits one process only.
func (a *Agent) checkComputeModes() error {
	n, ok := a.inv.(*inventory.NVML)
	if !ok {
		return nil
	}
	for i := range a.devs {
		mode, err := n.ComputeMode(i)
		if err != nil {
			continue
		}
		if mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS || mode == nvml.COMPUTEMODE_PROHIBITED {
			return fmt.Errorf("--instances-per-gpu %d needs a GPU that admits several processes, but GPU %d's compute mode is %s; use --instances-per-gpu 1 or set the compute mode to DEFAULT (nvidia-smi -c DEFAULT)",
				a.cfg.Model.InstancesPerGPU, i, computeModeName(mode))
		}
	}
	return nil
}

func computeModeName(m nvml.ComputeMode) string {
	switch m {
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "EXCLUSIVE_PROCESS"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "PROHIBITED"
	}
	return strconv.Itoa(int(m))
}

// layoutEnv is the environment layout.json gives instance k of GPU g: what a
// process claiming one unit offline runs with.
func (a *Agent) layoutEnv(g, k int) map[string]string {
	env := map[string]string{
		"CUDA_VISIBLE_DEVICES":              a.devs[g].UUID,
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": strconv.Itoa(a.cfg.Model.ThreadPercentage(1)),
	}
	if a.mpsOn {
		for key, v := range a.mps.Env(a.devs[g].UUID, k) {
			env[key] = v
		}
		env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = fmt.Sprintf("0=%dM", a.cfg.Model.MemoryShareMiB(1, a.devs[g].MemoryTotalMiB))
	}
	return env
}

func (a *Agent) adminGID() int {
	if a.cfg.AdminGroup == "" {
		return -1
	}
	g, err := user.LookupGroup(a.cfg.AdminGroup)
	if err != nil {
		a.log.Warn("--admin-group not found; only root acts as admin", "group", a.cfg.AdminGroup)
		return -1
	}
	gid, _ := strconv.Atoi(g.Gid)
	return gid
}

// listen returns the API listener: the one systemd passed, or the socket at
// --socket, replacing a stale socket file and refusing a live one.
func (a *Agent) listen() (net.Listener, error) {
	if lns, err := activation.Listeners(); err == nil && len(lns) > 0 && lns[0] != nil {
		a.log.Info("using the socket passed by systemd", "addr", lns[0].Addr().String())
		return lns[0], nil
	}
	path := a.cfg.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--socket %s exists and is not a socket; refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another gpuletd is already serving %s", path)
		}
		a.log.Info("removing stale socket left by an earlier run", "socket", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	a.chownSocket(path)
	return ln, nil
}

func (a *Agent) chownSocket(path string) {
	if a.cfg.SocketGroup == "" {
		return
	}
	g, err := user.LookupGroup(a.cfg.SocketGroup)
	if err != nil {
		a.log.Warn("--socket-group not found: the socket stays in the daemon's group, so only its user (and root) can use it", "group", a.cfg.SocketGroup)
		return
	}
	gid, _ := strconv.Atoi(g.Gid)
	if err := os.Chown(path, -1, gid); err != nil {
		a.log.Warn("cannot give the socket to --socket-group", "group", a.cfg.SocketGroup, "err", err)
	}
}

// sample reads every GPU and updates what placement sees.
func (a *Agent) sample() {
	var view lease.View
	if a.leases != nil {
		view = a.leases.View()
	}
	out := make([]inventory.Sample, len(a.devs))
	for i := range a.devs {
		load := inventory.Load{UnitsTotal: a.cfg.Model.UnitsPerGPU}
		if i < len(view.GPUs) {
			load.UnitsUsed = view.GPUs[i].Used
		}
		out[i] = a.inv.Sample(i, load)
	}
	a.sampleMu.Lock()
	a.samples = out
	a.sampleMu.Unlock()
	a.updateConditions()
}

func (a *Agent) lastSamples() []inventory.Sample {
	a.sampleMu.Lock()
	defer a.sampleMu.Unlock()
	return a.samples
}

// gpuState is the state and eligibility of GPU i from its sample.
func (a *Agent) gpuState(s inventory.Sample) (state string, eligible bool, why string) {
	switch {
	case s.Err != nil:
		return api.GPUFailed, false, "failed: " + s.Err.Error()
	case s.UtilizationPct > a.cfg.MaxUtilization:
		return api.GPUWorking, false, fmt.Sprintf("is %d%% busy, above --max-utilization %d%%", s.UtilizationPct, a.cfg.MaxUtilization)
	}
	return api.GPUWorking, true, ""
}

func (a *Agent) updateConditions() {
	samples := a.lastSamples()
	c := &lease.Conditions{Draining: a.draining.Load(), GPUs: make([]lease.GPUCondition, len(a.devs))}
	for i, d := range a.devs {
		_, eligible, why := a.gpuState(samples[i])
		free := uint64(0)
		if samples[i].MemoryUsedMiB < d.MemoryTotalMiB {
			free = d.MemoryTotalMiB - samples[i].MemoryUsedMiB
		}
		gc := lease.GPUCondition{Eligible: eligible, Why: why, MemoryFreeMiB: free}
		for _, st := range a.mps.Status(d.UUID) {
			gc.InstanceUp = append(gc.InstanceUp, st.State == api.InstanceRunning || st.State == api.InstanceOff)
			gc.ServerUID = append(gc.ServerUID, st.ServerUID)
		}
		c.GPUs[i] = gc
	}
	a.conditions.Store(c)
}

// changed says that the lease table, the samples or a condition changed: the
// next read of the snapshot builds a new one.
func (a *Agent) changed() { a.store.Invalidate() }

// buildSnapshot makes a snapshot from the lease table and the last samples;
// the store calls it, one at a time, on the first read after a change.
func (a *Agent) buildSnapshot() *snapshot.Published {
	view := a.leases.View()
	samples := a.lastSamples()
	a.seq++
	s := &api.Snapshot{
		Schema: api.SnapshotSchema, Node: a.cfg.NodeName, BootID: a.bootID, Seq: a.seq,
		Time: time.Now().UTC(), State: api.NodeWorking, Backend: a.inv.Backend(), MPS: mpsMode(a.mpsOn),
		GPUs: make([]api.GPU, len(a.devs)),
	}
	if a.draining.Load() {
		s.State = api.NodeDraining
	}
	s.View = a.view.Load()
	U := a.cfg.Model.UnitsPerGPU
	for i, d := range a.devs {
		gv := view.GPUs[i]
		state, eligible, _ := a.gpuState(samples[i])
		g := api.GPU{
			Index: d.Index, UUID: d.UUID, Name: d.Name, State: state, Eligible: eligible,
			UnitsTotal: U, UnitsUsed: gv.Used, UnitsFree: U - gv.Used, UnitsOffline: gv.Offline,
			UtilizationPct: samples[i].UtilizationPct, MaxUtilizationPct: a.cfg.MaxUtilization,
			MemoryTotalMiB: d.MemoryTotalMiB, MemoryUsedMiB: samples[i].MemoryUsedMiB,
			Capability: api.Capability{
				ComputeCapability: d.ComputeCapability(), Cores: d.Cores, MaxSMClockMHz: d.MaxSMClockMHz,
				MemoryBusWidthBit: d.MemoryBusWidthBit, MemoryClockMHz: d.MemoryClockMHz,
			},
		}
		if samples[i].Err != nil {
			g.Error = samples[i].Err.Error()
		}
		mpsStates := a.mps.Status(d.UUID)
		anyUp := false
		for k, iv := range gv.Instances {
			in := api.Instance{
				Instance: k, State: api.InstanceOff, Clients: iv.Clients,
				ClientsMax: a.cfg.Model.ClientsPerInstance, Units: a.cfg.Model.InstanceUnits(k), UID: iv.UID,
			}
			if k < len(mpsStates) {
				st := mpsStates[k]
				in.State = st.State
				if st.ServerUID != nil {
					in.UID = st.ServerUID
				}
				if st.Err != nil {
					in.Error = st.Err.Error()
				}
			}
			anyUp = anyUp || in.State == api.InstanceRunning || in.State == api.InstanceOff
			if g.State == api.GPUWorking && (in.State == api.InstanceDown || in.State == api.InstanceStarting) {
				g.State = api.GPUDegraded
			}
			g.Instances = append(g.Instances, in)
		}
		// A degraded GPU still takes leases on its running instances.
		g.Eligible = g.Eligible && anyUp
		s.GPUs[i] = g
		s.UnitsTotal += g.UnitsTotal
		s.UnitsFree += g.UnitsFree
		s.UnitsReserved += g.UnitsReserved
	}
	counts := metrics.Leases{Live: uint64(len(view.Leases)), Granted: view.Granted, Ended: view.Ended}
	return snapshot.New(s, view.Leases, func(s *api.Snapshot) []byte { return metrics.Render(s, counts) })
}

// Published is the current snapshot.
func (a *Agent) Published() *snapshot.Published { return a.store.Load() }

// Acquire grants a lease.
func (a *Agent) Acquire(ctx context.Context, peer lease.Peer, req lease.Request) (lease.Grant, error) {
	return a.leases.Acquire(ctx, peer, req)
}

// List lists peer's leases (all, for admins).
func (a *Agent) List(peer lease.Peer) []api.Lease { return a.leases.List(peer) }

// Get returns one lease.
func (a *Agent) Get(peer lease.Peer, id string) (api.Lease, error) { return a.leases.Get(peer, id) }

// Renew extends a time-bound lease.
func (a *Agent) Renew(peer lease.Peer, id string) (api.Lease, error) { return a.leases.Renew(peer, id) }

// Release ends a lease.
func (a *Agent) Release(peer lease.Peer, id string) error { return a.leases.Release(peer, id) }

// SetDraining stops or resumes new leases.
func (a *Agent) SetDraining(on bool) {
	if a.draining.Swap(on) != on {
		a.log.Info("node draining changed", "draining", on)
	}
	a.updateConditions()
	a.changed()
}

// SimGPU is the simulated backend's control, nil on a real backend.
func (a *Agent) SimGPU() func(int, api.SimGPUUpdate) error {
	sim, ok := a.inv.(*inventory.Sim)
	if !ok {
		return nil
	}
	return func(i int, u api.SimGPUUpdate) error {
		if err := sim.Set(i, u); err != nil {
			return err
		}
		a.sample()
		a.changed()
		return nil
	}
}
