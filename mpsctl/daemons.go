package mpsctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// Defaults for Config fields left zero.
const (
	DefaultTimeout    = 5 * time.Second
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	// DefaultMaxLog bounds each log file of an instance. The control daemon logs
	// every command it gets, the health probe's too (about 340 bytes a probe, 29
	// MB a day per instance at one probe a second), and nothing rotates its logs.
	DefaultMaxLog = 1 << 20
)

// maxPipeDir is the longest pipe folder path the control daemon can listen in
// (measured: 87 works, 88 fails; see the package comment).
const maxPipeDir = 87

// dirPerm is the mode of every folder this package creates: the pipe folder must
// let clients of any user reach the control socket, and nobody but root writes.
const dirPerm = 0o755

// defaultPath is the PATH given to the control daemon when gpuletd has none: the
// daemon finds nvidia-cuda-mps-server through PATH (Debian puts it in /usr/sbin).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config configures a Daemons.
type Config struct {
	// Control is the absolute path of nvidia-cuda-mps-control (from Resolve).
	// Empty means MPS is off: the Daemons is a null manager.
	Control string
	// RunDir holds instance k of GPU u under RunDir/mps/<u>/<k>/{pipe,log}. It
	// must be absolute, and short enough for the pipe folder to fit maxPipeDir.
	RunDir string
	// InstancesPerGPU is K, at least 1.
	InstancesPerGPU int
	// Timeout bounds each run of the control binary, and each wait for a daemon
	// to answer or to exit. Default DefaultTimeout.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before restarting a daemon that
	// died or hangs; it doubles with each consecutive failure. Defaults
	// DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxLog bounds control.log and server.log in each instance's log folder:
	// Check cuts a longer one, keeping its end in <name>.1. Default DefaultMaxLog.
	MaxLog int64
	// Logger gets one line per change of an instance; default slog.Default().
	Logger *slog.Logger
	// Now is the clock of the restart backoff; default time.Now.
	Now func() time.Time
	// Servers, when set, answers for the MPS servers and their clients
	// instead of the control daemon: the simulated backend's servers, on a
	// machine whose control daemons never start one.
	Servers ServerSource
}

// InstanceStatus is one instance as Status reports it.
type InstanceStatus struct {
	Instance int
	// State is api.InstanceStarting, api.InstanceRunning, api.InstanceDown, or
	// api.InstanceOff when MPS is off.
	State string
	// PID is the control daemon's pid, 0 when none is known.
	PID int
	// ServerUID is the uid of the MPS server that serves the instance's
	// clients now; nil when no server has a client. An idle server (its last
	// client gone) does not count: it stays up, but the control daemon
	// replaces it as soon as a client of another uid arrives (seen on an
	// H100: the new uid's server was up within its CUDA start).
	ServerUID *uint32
	// Clients counts the clients of the instance's MPS servers.
	Clients int
	// Servers are the instance's live MPS servers, idle ones included.
	Servers []Server
	// Err says why the instance is down; nil otherwise.
	Err error
}

// instance is one control daemon of one GPU.
type instance struct {
	gpu     string
	k       int
	pipeDir string
	logDir  string
	env     []string // environment of every run of the control binary for this instance
	log     *slog.Logger

	// The fields below are guarded by Daemons.mu.
	state        string
	pid          int
	serverUID    *uint32
	clients      int
	servers      []Server
	err          error
	failures     int       // consecutive failures, the exponent of the backoff
	retryAt      time.Time // a down instance is not restarted before this
	runningSince time.Time
}

func (in *instance) String() string { return in.gpu + "/" + strconv.Itoa(in.k) }

// Daemons owns the control daemons of all GPUs. Its methods may be called from
// different goroutines.
type Daemons struct {
	cfg   Config
	run   runner
	all   []*instance            // GPU order, then k; fixed by New
	byGPU map[string][]*instance // fixed by New

	// ops serializes Start, Check and Close, which start, kill and quit processes:
	// two at once could start a daemon beside one being adopted, or restart one
	// that Close just quit. Status does not take it, so it never waits for an exec.
	ops sync.Mutex

	// mu guards the fields of every instance marked as guarded, and closed.
	mu     sync.Mutex
	closed bool
}

// New checks cfg and prepares the instances of gpuUUIDs (the inventory's GPU
// UUIDs, never names from a request); it starts nothing.
func New(cfg Config, gpuUUIDs []string) (*Daemons, error) {
	if cfg.InstancesPerGPU < 1 {
		return nil, fmt.Errorf("mpsctl: %d instances per GPU: want at least 1", cfg.InstancesPerGPU)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.MaxLog <= 0 {
		cfg.MaxLog = DefaultMaxLog
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	on := cfg.Control != ""
	if on {
		if !filepath.IsAbs(cfg.RunDir) {
			return nil, fmt.Errorf("mpsctl: run dir %q is not absolute: clients get its paths in their environment", cfg.RunDir)
		}
		cfg.RunDir = filepath.Clean(cfg.RunDir)
	}
	d := &Daemons{
		cfg:   cfg,
		run:   runner{path: cfg.Control, timeout: cfg.Timeout},
		byGPU: make(map[string][]*instance),
	}
	for _, u := range gpuUUIDs {
		if !validUUID(u) {
			return nil, fmt.Errorf("mpsctl: GPU UUID %q cannot name a folder", u)
		}
		if d.byGPU[u] != nil {
			return nil, fmt.Errorf("mpsctl: GPU UUID %q listed twice", u)
		}
		for k := range cfg.InstancesPerGPU {
			in := &instance{gpu: u, k: k, state: api.InstanceOff, log: cfg.Logger.With("gpu", u, "instance", k)}
			if on {
				in.state = api.InstanceStarting
				dir := filepath.Join(cfg.RunDir, "mps", u, strconv.Itoa(k))
				in.pipeDir = filepath.Join(dir, "pipe")
				in.logDir = filepath.Join(dir, "log")
				if len(in.pipeDir) > maxPipeDir {
					return nil, fmt.Errorf("mpsctl: MPS pipe folder %s is %d bytes long, the control daemon takes at most %d: choose a shorter run dir", in.pipeDir, len(in.pipeDir), maxPipeDir)
				}
				in.env = daemonEnv(u, in.pipeDir, in.logDir)
			}
			d.all = append(d.all, in)
			d.byGPU[u] = append(d.byGPU[u], in)
		}
	}
	return d, nil
}

// validUUID accepts what NVML's UUIDs are made of ("GPU-" and hex with dashes),
// so that a UUID is always exactly one harmless path element.
func validUUID(u string) bool {
	if u == "" || len(u) > 96 {
		return false
	}
	for _, c := range u {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// daemonEnv is the whole environment of the control binary for one instance.
// It is built rather than inherited: the daemon outlives gpuletd and hands its
// environment to every MPS server, so gpuletd's own (NOTIFY_SOCKET, LISTEN_FDS,
// a stray CUDA_MPS_* variable) must not leak into it.
func daemonEnv(gpu, pipeDir, logDir string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env := []string{
		pipefile.EnvVisibleDevices + "=" + gpu,
		pipefile.EnvPipeDirectory + "=" + pipeDir,
		pipefile.EnvLogDirectory + "=" + logDir,
		"PATH=" + path,
	}
	// The server loads libcuda; a non-standard driver location is found only this way.
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		env = append(env, "LD_LIBRARY_PATH="+v)
	}
	return env
}

func (d *Daemons) on() bool { return d.cfg.Control != "" }

// On reports whether MPS is on; false for a null manager.
func (d *Daemons) On() bool { return d.on() }

// running counts the instances that run.
func (d *Daemons) running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, in := range d.all {
		if in.state == api.InstanceRunning {
			n++
		}
	}
	return n
}

// Start brings up every instance: it adopts a control daemon that already answers
// on the instance's pipe folder (one left running by an earlier gpuletd), and
// starts one otherwise. It returns when each instance runs or has failed; the
// error joins the failures, and failed instances are down and retried by Check.
// After Close it returns ErrClosed.
func (d *Daemons) Start(ctx context.Context) error {
	if !d.on() {
		return nil
	}
	d.ops.Lock()
	defer d.ops.Unlock()
	if d.isClosed() {
		return ErrClosed
	}
	return d.each(func(in *instance) error {
		st, err := d.probe(ctx, in)
		if err == nil {
			d.setRunning(in, st)
			in.log.Info("adopted running MPS control daemon", "pid", st.pid, "clients", st.clients)
			return nil
		}
		if !errors.Is(err, ErrNoDaemon) {
			in.log.Warn("MPS control daemon on the pipe folder does not answer, replacing it", "err", err)
		}
		if err := d.restart(ctx, in); err != nil {
			d.setDown(in, err)
			in.log.Error("cannot start MPS control daemon", "err", err)
			return err
		}
		return nil
	})
}

// Check makes one health pass: it probes every instance; one that died or stops
// answering becomes down and is restarted once its backoff has passed, and is
// running again once it answers. Instances are checked in parallel, so a pass
// takes about one probe, or up to about three Timeouts when a daemon hangs.
func (d *Daemons) Check(ctx context.Context) {
	if !d.on() {
		return
	}
	d.ops.Lock()
	defer d.ops.Unlock()
	if d.isClosed() {
		return
	}
	_ = d.each(func(in *instance) error {
		d.check(ctx, in)
		return nil
	})
}

func (d *Daemons) check(ctx context.Context, in *instance) {
	d.trimLogs(in)
	st, err := d.probe(ctx, in)
	if err == nil {
		if prev := d.setRunning(in, st); prev != api.InstanceRunning {
			in.log.Info("MPS control daemon answers", "pid", st.pid)
		}
		return
	}
	if ctx.Err() != nil {
		// The caller gave up (gpuletd is stopping): the probe says nothing about
		// the daemon.
		return
	}
	now := d.cfg.Now()
	d.mu.Lock()
	if in.state != api.InstanceDown {
		d.markDownLocked(in, err, now)
		in.log.Warn("MPS control daemon down", "err", err, "retry_in", in.retryAt.Sub(now))
	}
	due := !now.Before(in.retryAt)
	d.mu.Unlock()
	if !due {
		return
	}
	if err := d.restart(ctx, in); err != nil {
		retry := d.setDown(in, err)
		in.log.Warn("cannot restart MPS control daemon", "err", err, "retry_in", retry)
	}
}

// restart replaces whatever runs or ran on the instance's pipe folder with a
// fresh control daemon and waits until it answers.
func (d *Daemons) restart(ctx context.Context, in *instance) error {
	d.mu.Lock()
	in.state = api.InstanceStarting
	d.mu.Unlock()
	// Creating the folders each time also repairs them if someone removed them.
	// The run dir itself is the admin's choice and may be reached through a
	// symlink; below it nothing is followed.
	if err := os.MkdirAll(d.cfg.RunDir, dirPerm); err != nil {
		return fmt.Errorf("mpsctl: %w", err)
	}
	for _, dir := range []string{in.pipeDir, in.logDir} {
		rel, err := filepath.Rel(d.cfg.RunDir, dir)
		if err != nil {
			return fmt.Errorf("mpsctl: %w", err)
		}
		if err := mkdirs(d.cfg.RunDir, rel, dirPerm); err != nil {
			return err
		}
	}
	pid, err := lockHolder(in.pipeDir)
	if err != nil {
		return err
	}
	switch {
	case pid > 0 && !isOurDaemon(pid, d.cfg.Control):
		// control_lock is 0666 and outlives its daemon, so any user may lock
		// a stale one. Such a holder is no daemon and is not ours to kill;
		// cleanStale unlinks the file, and the new daemon locks a file of its
		// own beside the holder's.
		in.log.Warn("a process that is not our MPS control daemon holds its lock; starting a daemon on a fresh lock file", "pid", pid, "file", filepath.Join(in.pipeDir, lockFile))
	case pid > 0:
		// The daemon holds its lock but did not answer: it hangs, and a new one
		// would refuse to start beside it.
		in.log.Warn("killing hung MPS control daemon", "pid", pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("mpsctl: %s: kill %d: %w", in, pid, err)
		}
		if err := waitGone(ctx, pid, d.cfg.Timeout); err != nil {
			return err
		}
	}
	if err := cleanStale(in.pipeDir); err != nil {
		return err
	}
	if _, err := d.run.run(ctx, in.env, "", "-d"); err != nil {
		return fmt.Errorf("mpsctl: %s: start: %w", in, err)
	}
	st, err := d.awaitAnswer(ctx, in)
	if err != nil {
		return err
	}
	d.setRunning(in, st)
	in.log.Info("started MPS control daemon", "pid", st.pid)
	return nil
}

// awaitAnswer probes until the instance answers, for at most Timeout. "-d"
// returns once the daemon listens, so the first probe normally succeeds; only "no
// daemon yet" is worth another try, a hang or garbage will not get better.
func (d *Daemons) awaitAnswer(ctx context.Context, in *instance) (probeResult, error) {
	deadline := time.Now().Add(d.cfg.Timeout)
	for {
		st, err := d.probe(ctx, in)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, ErrNoDaemon) || time.Now().After(deadline) {
			return st, fmt.Errorf("mpsctl: %s: started but does not answer: %w", in, err)
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("mpsctl: %s: %w", in, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close stops gpuletd's use of the daemons: an instance whose MPS server has no
// clients is told to quit and waited for (bounded by Timeout); one with clients
// is left running, because quit would refuse new clients until all of them
// ended, and the next Start adopts it. A daemon that does not answer is left for
// the next Start to replace. Close is safe after a failed Start and when called
// again (it then does nothing).
func (d *Daemons) Close() error {
	if !d.on() {
		return nil
	}
	d.ops.Lock()
	defer d.ops.Unlock()
	d.mu.Lock()
	done := d.closed
	d.closed = true
	d.mu.Unlock()
	if done {
		return nil
	}
	return d.each(func(in *instance) error { return d.stop(context.Background(), in) })
}

func (d *Daemons) stop(ctx context.Context, in *instance) error {
	st, err := d.probe(ctx, in)
	if errors.Is(err, ErrNoDaemon) {
		d.setDown(in, ErrClosed)
		return nil
	}
	if err != nil {
		in.log.Warn("MPS control daemon does not answer, leaving it", "err", err)
		return err
	}
	if st.clients > 0 {
		// Said at every stop that leaves one, with what ends it, since
		// nothing else will: the clients' jobs may run for days.
		in.log.Info("leaving MPS control daemon running for its clients; the next start adopts it, or, once they end, "+
			"CUDA_MPS_PIPE_DIRECTORY=<pipe> nvidia-cuda-mps-control with quit on its input stops it",
			"pid", st.pid, "clients", st.clients, "pipe", in.pipeDir)
		return nil
	}
	_, err = d.run.run(ctx, in.env, "quit\n")
	if st.pid > 0 {
		// quit's exit status only says whether its servers ended gracefully; what
		// counts is that the daemon is gone.
		err = waitGone(ctx, st.pid, d.cfg.Timeout)
	}
	if err != nil {
		return fmt.Errorf("mpsctl: %s: quit: %w", in, err)
	}
	d.setDown(in, ErrClosed)
	in.log.Info("MPS control daemon quit", "pid", st.pid)
	return nil
}

// anyLockHeld reports whether some process holds the lock of an instance's
// pipe folder: the control daemon does for its whole life.
func (d *Daemons) anyLockHeld() bool {
	for _, in := range d.all {
		if pid, err := lockHolder(in.pipeDir); pid > 0 || err != nil {
			return true
		}
	}
	return false
}

// each runs fn on every instance at once and joins the errors in instance order:
// instances are independent, and one hung daemon's timeout must not add up over
// all of them.
func (d *Daemons) each(fn func(*instance) error) error {
	errs := make([]error, len(d.all))
	var wg sync.WaitGroup
	for i, in := range d.all {
		wg.Go(func() { errs[i] = fn(in) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (d *Daemons) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}
