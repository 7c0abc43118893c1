// Package gpurun is the gpurun command (docs/design.md §7): lease units bound
// to its own pid, put the lease's environment in place, and exec the command in
// the same process, so that the lease lives exactly as long as the command.
// With --offline it claims units through the pipe-file ledger instead
// (package offline). It keeps nothing after the exec: gpuletd, or the ledger's
// locks, hold the units.
package gpurun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/offline"
	"github.com/gpulet/gpulet/internal/slurmenv"
	"github.com/gpulet/gpulet/internal/version"
	"github.com/gpulet/gpulet/pipefile"
)

// Exit codes of gpurun's own failures; once the command runs, the exit code is
// the command's. They follow env(1) and nohup(1), so scripts that wrap
// commands already know them.
const (
	ExitFailure     = 125 // gpurun could not get units: no daemon, no units, an API error
	ExitUsage       = 2
	ExitNotRunnable = 126 // the command exists but cannot be executed
	ExitNotFound    = 127 // the command was not found
	// An interrupted gpurun exits 128 + the signal: 130 for SIGINT, 143 for SIGTERM.
)

// LeaseIDEnv names the lease in the command's environment. Under --offline it
// is "offline": there is no lease, and a stale id inherited from a caller that
// itself runs under gpurun must not leak into the command.
const LeaseIDEnv = pipefile.EnvLeaseID

// OfflineLeaseID is LeaseIDEnv's value under --offline.
const OfflineLeaseID = "offline"

// managedEnv are the variables gpurun owns: each is set from the lease, or
// removed from the caller's environment when the lease does not set it, so that
// a command started from inside another gpurun (or with MPS variables of an
// earlier job) never reaches an MPS server or a GPU it was not given. Every
// variable starting with managedPrefix is owned too (docs/design.md §7):
// an MPS client setting the caller kept, such as its priority, would apply
// to a server or a GPU the caller did not choose.
var managedEnv = []string{
	pipefile.EnvVisibleDevices,
	pipefile.EnvPipeDirectory,
	pipefile.EnvLogDirectory,
	pipefile.EnvThreadPercentage,
	pipefile.EnvPinnedMemLimit,
	LeaseIDEnv,
}

// managedPrefix starts the MPS client's variables, all of them gpurun's.
const managedPrefix = "CUDA_MPS_"

// Options are gpurun's parsed flags.
type Options struct {
	Units int
	// GPUs asks for that many whole GPUs instead of units (Units is then
	// not sent): the command runs on them without MPS.
	GPUs      int
	GPU       string
	Pool      string
	Type      string
	MemoryMiB uint64
	// MinCC is the lowest compute capability accepted, MAJOR.MINOR as
	// checked by Parse; empty: any.
	MinCC       string
	Task        string
	Reservation string
	Wait        time.Duration
	Offline     bool
	// Preemptible consents to borrow units a reservation lends.
	Preemptible bool
	// Slurm makes the lease its Slurm job's (set under SLURM_JOB_ID, see
	// slurm.go); unitsGiven and gpuGiven say the flags chose over Slurm.
	Slurm                bool
	unitsGiven, gpuGiven bool
	// DryRun shows where a lease would go and why, leases nothing and runs
	// nothing.
	DryRun bool
	// JSON prints the dry run's answer as gpuletd sent it (api.Placement).
	JSON bool
	// Version prints gpurun's version and commit and does nothing else.
	Version bool
	Socket  string
	RunDir  string
	Command []string
}

const usageHead = `gpurun runs a command on GPU units leased from gpuletd.

Usage: gpurun [flags] -- COMMAND [ARGS...]

gpurun leases units bound to its own process, sets the lease's environment
(CUDA_VISIBLE_DEVICES, the MPS variables, GPULET_LEASE_ID) and replaces itself
with COMMAND, which keeps gpurun's pid: the lease ends when the command exits,
however it exits. Everything after COMMAND is the command's own.

Examples:
  gpurun -- python train.py                      one unit, anywhere
  gpurun --units 2 --type A100 -- python train.py
  gpurun --gpu 1 --memory 20G -- ./infer.sh      GPU 1, with 20 GiB of its memory
  gpurun --gpus 2 -- torchrun train.py           two whole GPUs, without MPS
  gpurun --min-cc 8.0 -- python train.py         a GPU of compute capability 8.0 or above
  gpurun --wait 10m -- python train.py           queue for up to 10 minutes
  gpurun --offline -- ./job                      claim units without gpuletd
  gpurun --dry-run --units 2 --task resnet50     where would it go, and why
  gpurun --dry-run --json --gpus 2               the same, as JSON

Exit status: the command's; gpurun's own failures exit 125 (no units, no
daemon, an API error), 126 (command not executable), 127 (command not found),
2 (usage), 130 or 143 (SIGINT or SIGTERM while waiting for units).

Flags:
`

// Parse parses gpurun's arguments; --help writes the usage to help.
func Parse(args []string, help io.Writer) (Options, error) {
	var o Options
	var memory string
	fs := pflag.NewFlagSet("gpurun", pflag.ContinueOnError)
	fs.SetOutput(help)
	// The command's flags are the command's: parsing stops at the first
	// argument that is not gpurun's, with or without "--".
	fs.SetInterspersed(false)
	fs.SortFlags = false
	fs.IntVarP(&o.Units, "units", "n", 1, "units to lease (one process holds at most gpuletd's --units-per-client)")
	fs.IntVar(&o.GPUs, "gpus", 0, "whole GPUs to lease, every unit of each: the command runs on them without MPS (not with --units, --gpu, --reservation or --preemptible)")
	fs.StringVar(&o.GPU, "gpu", "", "GPU index or UUID")
	fs.StringVar(&o.Pool, "pool", "", "pool to lease from")
	fs.StringVar(&o.Type, "type", "", "GPU type: a case-insensitive part of its name, e.g. A100 or t4")
	fs.StringVar(&memory, "memory", "", "GPU memory the command needs, with its unit: 8G (GiB), 512M (MiB)")
	fs.StringVar(&o.MinCC, "min-cc", "", "lowest CUDA compute capability the command runs on, MAJOR.MINOR such as 8.0 (A100) or 7.5 (T4)")
	fs.StringVar(&o.Task, "task", "", "task name, for gpuletd's run-time profiles")
	fs.StringVar(&o.Reservation, "reservation", "", "workflow reservation to draw on (its owner and admins) or to borrow from (a member of its share group: the lease is preemptible)")
	fs.DurationVar(&o.Wait, "wait", 0, "wait up to this long for units instead of failing at once, e.g. 30s or 10m")
	fs.BoolVar(&o.Preemptible, "preemptible", false, "when no ordinary units are free, borrow units a workflow reservation lends you: the command gets SIGTERM, then SIGKILL, when the reservation takes them back")
	fs.BoolVar(&o.Offline, "offline", false, "claim units through the pipe-file ledger, without gpuletd")
	fs.BoolVar(&o.DryRun, "dry-run", false, "show where the lease would go now and why each GPU was kept or left out; lease nothing, run nothing (COMMAND may be left out)")
	fs.StringVar(&o.Socket, "socket", "", "gpuletd's socket (default $GPULET_SOCKET, else "+client.DefaultSocket+")")
	fs.StringVar(&o.RunDir, "run-dir", "", "gpuletd's run dir, for --offline (default $"+pipefile.EnvRunDir+", else "+pipefile.DefaultRunDir+")")
	fs.BoolVar(&o.JSON, "json", false, "with --dry-run: print gpuletd's answer as JSON (POST /v1/placements), for scripts")
	fs.BoolVar(&o.Version, "version", false, "print gpurun's version and commit, and exit")
	fs.Usage = func() { fmt.Fprint(help, usageHead+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.Version {
		return o, nil
	}
	o.Command = fs.Args()
	o.unitsGiven, o.gpuGiven = fs.Changed("units"), fs.Changed("gpu")
	if o.JSON && !o.DryRun {
		return o, errors.New("--json prints a dry run's answer: it needs --dry-run")
	}
	if o.DryRun && o.Offline {
		return o, errors.New("--dry-run asks gpuletd: it cannot be used with --offline")
	}
	if len(o.Command) == 0 && !o.DryRun {
		return o, errors.New("no command given: gpurun [flags] -- COMMAND [ARGS...]")
	}
	if o.Units < 1 {
		return o, fmt.Errorf("--units must be at least 1, got %d", o.Units)
	}
	if err := checkWhole(fs, o); err != nil {
		return o, err
	}
	if memory != "" {
		var err error
		if o.MemoryMiB, err = ParseMemory(memory); err != nil {
			return o, err
		}
	}
	if o.MinCC != "" {
		if _, err := api.ParseComputeCapability(o.MinCC); err != nil {
			return o, fmt.Errorf("--min-cc: %v", err)
		}
	}
	if o.Wait < 0 {
		return o, fmt.Errorf("--wait %s: want a positive duration such as 30s or 10m", o.Wait)
	}
	if o.Offline {
		// Only gpuletd knows pools, reservations, memory use, task profiles and
		// waiters; an offline claim that silently ignored them would mislead.
		// layout.json, which offline claims read, does not carry compute
		// capabilities.
		for _, f := range []string{"gpus", "pool", "reservation", "preemptible", "memory", "min-cc", "task", "wait"} {
			if fs.Changed(f) {
				return o, fmt.Errorf("--%s needs gpuletd: it cannot be used with --offline", f)
			}
		}
	}
	return o, nil
}

// maxMemoryMiB bounds --memory: 1 PiB, far above any GPU, keeps the sum
// exact.
const maxMemoryMiB = 1 << 30

// memoryUnits are --memory's suffixes, in MiB. Sizes are binary, as
// nvidia-smi shows them: 1G is 1024 MiB whichever spelling is used. A plain
// number has no unit: "8" meant as 8 GiB would silently be 8 MiB.
var memoryUnits = map[string]uint64{
	"M": 1, "MB": 1, "MIB": 1,
	"G": 1 << 10, "GB": 1 << 10, "GIB": 1 << 10,
	"T": 1 << 20, "TB": 1 << 20, "TIB": 1 << 20,
}

// ParseMemory reads a memory size in MiB: "8G", "512M", "1T"; suffixes may
// end in "B" or "iB", in any case. A number needs its unit.
func ParseMemory(s string) (uint64, error) {
	digits := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	mult, ok := memoryUnits[strings.ToUpper(s[len(digits):])]
	n, err := strconv.ParseUint(digits, 10, 64)
	if err == nil && n > 0 && digits == s {
		return 0, fmt.Errorf("--memory %s: give its unit: %sG for GiB, %sM for MiB", s, s, s)
	}
	if !ok || err != nil || n == 0 || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, fmt.Errorf("--memory %q: want a whole size with its unit, such as 8G or 512M", s)
	}
	if n > maxMemoryMiB/mult {
		return 0, fmt.Errorf("--memory %q: more than any GPU has", s)
	}
	return n * mult, nil
}

// signalCause is why catchSignals' context ended.
type signalCause struct{ sig syscall.Signal }

func (s signalCause) Error() string { return s.sig.String() }

// catchSignals makes SIGINT and SIGTERM end ctx, with the signal as its
// cause, until stop is called; once stop returns, ctx's cause is final. Only a
// waiting gpurun catches signals: catching costs threads that every exec pays
// for, and without --wait the lease request takes a millisecond, so a signal
// then kills gpurun, which gpuletd sees as the request's connection closing
// and the lease's process gone.
func catchSignals(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM} {
		// A signal the caller ignores stays ignored: a shell ignores SIGINT
		// in its background jobs so that Ctrl-C spares them, and the
		// command, which inherits that, would not end by it either.
		if !signal.Ignored(sig) {
			signal.Notify(ch, sig)
		}
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig := <-ch:
			cancel(signalCause{sig.(syscall.Signal)})
		case <-quit:
		}
	}()
	return ctx, func() {
		// From here a signal has its default effect: it ends gpurun, or,
		// after the exec, the command.
		signal.Stop(ch)
		close(quit)
		<-exited
		// A signal relayed before Stop that the goroutine did not take.
		select {
		case sig := <-ch:
			cancel(signalCause{sig.(syscall.Signal)})
		default:
		}
	}
}

// interrupted returns the signal that ended ctx, or 0.
func interrupted(ctx context.Context) syscall.Signal {
	var s signalCause
	if errors.As(context.Cause(ctx), &s) {
		return s.sig
	}
	return 0
}

// Run runs gpurun and returns its exit code; when the command starts it does
// not return, as the command replaces it. ctx ending with a signalCause counts
// as that signal (tests use it; a waiting gpurun catches real ones).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := Parse(args, stdout)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\nRun 'gpurun --help' for usage.\n", err)
		return ExitUsage
	}
	if o.Version {
		version.Print(stdout, "gpurun")
		return 0
	}
	if !o.Offline && slurmenv.InJob(os.Getenv) {
		if err := o.applySlurm(ctx, os.Getenv); err != nil {
			fmt.Fprintln(stderr, "gpurun:", err)
			return ExitFailure
		}
	}
	if o.DryRun {
		return dryRun(ctx, o, stdout, stderr)
	}
	// The command is found before any unit is taken: a typo costs nothing.
	path, code, err := lookCommand(o.Command[0])
	if err != nil {
		fmt.Fprintln(stderr, "gpurun:", err)
		return code
	}
	stopSignals := func() {}
	if o.Wait > 0 {
		ctx, stopSignals = catchSignals(ctx)
	}
	var env map[string]string
	var giveBack func()
	if o.Offline {
		env, giveBack, err = claimOffline(o)
	} else {
		env, giveBack, err = lease(ctx, o, stderr)
	}
	stopSignals()
	if sig := interrupted(ctx); sig != 0 {
		// A lease granted as the signal came goes back; the waiting request
		// itself ended with its connection, and gpuletd dropped it.
		if err == nil {
			giveBack()
		}
		fmt.Fprintf(stderr, "gpurun: %s while waiting for units: nothing was leased\n", sig)
		return 128 + int(sig)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpurun:", err)
		return ExitFailure
	}
	// The command becomes the subreaper of what it starts (the setting
	// survives exec): a process that double-forks away from it, as daemons
	// do, is re-parented to the command, not to init, so that its GPU use
	// is still found under the lease's or claim's process. No privilege is
	// needed; it fails only on kernels older than 3.4, and then costs only
	// that attribution. Orphans that the command does not reap stay
	// zombies, holding a pid and no memory, until it exits.
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	err = syscall.Exec(path, o.Command, MergeEnv(os.Environ(), env))
	// Exec returned: the command did not start, so the units go back.
	giveBack()
	code = ExitNotRunnable
	if errors.Is(err, syscall.ENOENT) {
		code = ExitNotFound
	}
	fmt.Fprintf(stderr, "gpurun: %s: %v\n", o.Command[0], err)
	return code
}

// request is the lease request the flags ask for.
func (o Options) request() api.LeaseRequest {
	r := api.LeaseRequest{Units: o.Units, GPU: o.GPU, Pool: o.Pool, Type: o.Type, MemoryMiB: o.MemoryMiB, MinCC: o.MinCC, Task: o.Task, Reservation: o.Reservation, Preemptible: o.Preemptible}
	if o.GPUs > 0 {
		r.Units, r.GPUs = 0, o.GPUs
	}
	if o.Slurm {
		r.Slurm = api.SlurmScopeJob
	}
	return r
}

// lookCommand finds the command the way a shell does.
func lookCommand(name string) (string, int, error) {
	path, err := exec.LookPath(name)
	switch {
	case err == nil:
		return path, 0, nil
	case errors.Is(err, exec.ErrDot):
		// Found through a relative PATH entry: a shell would run it, and so
		// does gpurun, which runs what the user's own PATH names.
		return path, 0, nil
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return "", ExitNotFound, fmt.Errorf("%s: command not found", name)
	}
	return "", ExitNotRunnable, fmt.Errorf("%s: permission denied", name)
}

// lease takes the units from gpuletd and returns the variables to set and how
// to give the units back if the command does not start.
func lease(ctx context.Context, o Options, stderr io.Writer) (map[string]string, func(), error) {
	c := &client.Client{Socket: o.Socket}
	// No ttl and no pid: gpuletd binds the lease to the process that
	// connected (SO_PEERPIDFD), which is gpurun and, after exec, the command.
	req := o.request()
	l, err := c.Lease(ctx, req)
	// A request nothing here can ever fit fails at once, wait or not:
	// saying it waits would mislead.
	if o.Wait > 0 && errors.Is(err, client.ErrInsufficientUnits) && !strings.Contains(err.Error(), api.NeverFits) {
		// Asking without waiting first means the message below is printed
		// only when gpurun really waits.
		fmt.Fprintln(stderr, "gpurun:", waitMessage(ctx, c, o))
		req.Wait = o.Wait.String()
		l, err = c.Lease(ctx, req)
	}
	if err != nil {
		return nil, nil, describe(err, o)
	}
	env := map[string]string{LeaseIDEnv: l.ID}
	for k, v := range l.Env {
		env[k] = v
	}
	if o.Slurm {
		// The job's lease, which another step may share: the job's end
		// frees it, not this command's failure to start.
		return env, func() {}, nil
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Release(rctx, l.ID)
	}
	return env, release, nil
}

// claimOffline claims the units through the pipe-file ledger.
func claimOffline(o Options) (map[string]string, func(), error) {
	runDir := pipefile.RunDir(o.RunDir)
	lay, err := pipefile.ReadLayout(runDir)
	if err != nil {
		return nil, nil, fmt.Errorf("--offline: %w", err)
	}
	cl, err := offline.Take(runDir, lay, offline.Request{Units: o.Units, GPU: o.GPU, Type: o.Type, UID: uint32(os.Geteuid())})
	if err != nil {
		return nil, nil, fmt.Errorf("--offline: %w", err)
	}
	env := map[string]string{LeaseIDEnv: OfflineLeaseID}
	for k, v := range cl.Env {
		env[k] = v
	}
	return env, cl.Release, nil
}

// MergeEnv is base without the variables gpurun owns, plus set. Other
// variables keep their order; set's follow, sorted, so that the command's
// environment does not depend on map order.
func MergeEnv(base []string, set map[string]string) []string {
	out := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok || isManaged(k) {
			continue
		}
		out = append(out, kv)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+set[k])
	}
	return out
}

func isManaged(k string) bool {
	if strings.HasPrefix(k, managedPrefix) {
		return true
	}
	for _, m := range managedEnv {
		if k == m {
			return true
		}
	}
	return false
}
