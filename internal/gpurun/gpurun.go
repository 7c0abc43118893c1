// Package gpurun is the gpurun command: lease units bound to its own pid, put
// the lease's environment in place, and exec the command in the same process,
// so that the lease lives exactly as long as the command.
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

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/offline"
)

// Exit codes of gpurun's own failures; otherwise the exit code is the command's.
const (
	ExitFailure     = 125 // gpurun could not get units (no daemon, no units, API error)
	ExitUsage       = 2
	ExitNotRunnable = 126 // the command exists but cannot be executed
	ExitNotFound    = 127 // the command was not found
	ExitInterrupted = 130 // Ctrl-C while waiting for units
)

// LeaseIDEnv names the lease in the command's environment.
const LeaseIDEnv = "GPULET_LEASE_ID"

// Options are gpurun's parsed flags.
type Options struct {
	Units       int
	GPU         string
	Pool        string
	Type        string
	MemoryMiB   uint64
	Task        string
	Reservation string
	Wait        time.Duration
	Offline     bool
	Socket      string
	RunDir      string
	Command     []string
}

const usageHead = `gpurun runs a command on GPU units leased from gpuletd.

Usage: gpurun [flags] -- COMMAND [ARGS...]

The lease is bound to the command's process: it ends when the command exits.
The command runs with the lease's environment (CUDA_VISIBLE_DEVICES, the MPS
variables) and GPULET_LEASE_ID. The exit status is the command's; gpurun's own
failures exit 125 (no units, no daemon), 126 (command not executable), 127
(command not found), 2 (usage), 130 (interrupted while waiting).

Examples:
  gpurun -- python train.py
  gpurun --units 2 --type A100 --memory 20G -- python train.py
  gpurun --wait 10m -- ./infer.sh
  gpurun --offline -- ./job     (claim units without the daemon)

Flags:
`

// Parse parses gpurun's arguments.
func Parse(args []string, out io.Writer) (Options, error) {
	var o Options
	var memory, wait string
	fs := pflag.NewFlagSet("gpurun", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.SetInterspersed(false)
	fs.IntVarP(&o.Units, "units", "n", 1, "units to lease")
	fs.StringVar(&o.GPU, "gpu", "", "GPU index or UUID")
	fs.StringVar(&o.Pool, "pool", "", "pool to lease from")
	fs.StringVar(&o.Type, "type", "", "GPU type: a case-insensitive part of its name, e.g. A100 or T4")
	fs.StringVar(&memory, "memory", "", "GPU memory the command needs, e.g. 8G, 512M, or MiB as a plain number")
	fs.StringVar(&o.Task, "task", "", "task name (for run-time profiles)")
	fs.StringVar(&o.Reservation, "reservation", "", "workflow reservation to draw from")
	fs.StringVar(&wait, "wait", "", "wait this long for units instead of failing at once, e.g. 30s or 10m")
	fs.BoolVar(&o.Offline, "offline", false, "claim units through the pipe-file ledger, without gpuletd")
	fs.StringVar(&o.Socket, "socket", "", "gpuletd's socket (default $GPULET_SOCKET, else "+client.DefaultSocket+")")
	fs.StringVar(&o.RunDir, "run-dir", "", "gpuletd's run dir, for --offline (default $GPULET_RUN_DIR, else "+offline.DefaultRunDir+")")
	fs.Usage = func() { fmt.Fprint(out, usageHead+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.Command = fs.Args()
	if len(o.Command) == 0 {
		return o, errors.New("no command given: gpurun [flags] -- COMMAND [ARGS...]")
	}
	if o.Units < 1 {
		return o, fmt.Errorf("--units must be at least 1, got %d", o.Units)
	}
	var err error
	if memory != "" {
		if o.MemoryMiB, err = ParseMemory(memory); err != nil {
			return o, err
		}
	}
	if wait != "" {
		if o.Wait, err = time.ParseDuration(wait); err != nil || o.Wait <= 0 {
			return o, fmt.Errorf("--wait %q: want a positive duration such as 30s or 10m", wait)
		}
	}
	if o.Offline && (o.Pool != "" || o.Reservation != "" || o.Wait > 0) {
		return o, errors.New("--offline claims without the daemon: --pool, --reservation and --wait need gpuletd")
	}
	return o, nil
}

// ParseMemory reads a memory size in MiB: "8G", "8GiB", "512M", "8000" (MiB).
func ParseMemory(s string) (uint64, error) {
	bad := fmt.Errorf("--memory %q: want a size such as 8G, 512M or 8000 (MiB)", s)
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := uint64(1)
	switch {
	case strings.HasSuffix(t, "T"):
		mult, t = 1<<20, strings.TrimSuffix(t, "T")
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<10, strings.TrimSuffix(t, "G")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	}
	n, err := strconv.ParseUint(t, 10, 32)
	if err != nil || n == 0 {
		return 0, bad
	}
	return n * mult, nil
}

// Main runs gpurun and returns its exit code; on success it does not return,
// as the command replaces it.
func Main(args []string, stderr io.Writer) int {
	o, err := Parse(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpurun:", err)
		return ExitUsage
	}
	path, code, err := lookCommand(o.Command[0])
	if err != nil {
		fmt.Fprintln(stderr, "gpurun:", err)
		return code
	}
	env, release, code := acquire(o, stderr)
	if code != 0 {
		return code
	}
	err = syscall.Exec(path, o.Command, mergeEnv(os.Environ(), env))
	// Exec returned: the command did not start, so the units go back.
	release()
	code = ExitNotRunnable
	if errors.Is(err, syscall.ENOENT) {
		code = ExitNotFound
	}
	fmt.Fprintf(stderr, "gpurun: %s: %v\n", o.Command[0], err)
	return code
}

// lookCommand finds the command the way a shell does, before any unit is taken.
func lookCommand(name string) (string, int, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, 0, nil
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return "", ExitNotFound, fmt.Errorf("%s: command not found", name)
	}
	return "", ExitNotRunnable, fmt.Errorf("%s: permission denied", name)
}

// acquire takes the units, from gpuletd or offline, and returns the variables
// to set and how to give the units back if the command does not start.
func acquire(o Options, stderr io.Writer) (map[string]string, func(), int) {
	if o.Offline {
		return acquireOffline(o, stderr)
	}
	c := &client.Client{Socket: o.Socket}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	req := api.LeaseRequest{Units: o.Units, GPU: o.GPU, Pool: o.Pool, Type: o.Type, MemoryMiB: o.MemoryMiB, Task: o.Task, Reservation: o.Reservation}
	if o.Wait > 0 {
		req.Wait = o.Wait.String()
		go tellWaiting(ctx, c, o, stderr)
	}
	l, err := c.Lease(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "gpurun: interrupted while waiting for units; nothing was leased")
			return nil, nil, ExitInterrupted
		}
		fmt.Fprintln(stderr, "gpurun:", describe(err, c, o))
		return nil, nil, ExitFailure
	}
	env := map[string]string{LeaseIDEnv: l.ID}
	for k, v := range l.Env {
		env[k] = v
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Release(rctx, l.ID)
	}
	return env, release, 0
}

// describe turns a lease error into one line that says what to do.
func describe(err error, c *client.Client, o Options) string {
	switch {
	case errors.Is(err, client.ErrNoDaemon):
		return fmt.Sprintf("%v\n  start gpuletd, point --socket or GPULET_SOCKET at it, or claim units without it: gpurun --offline", err)
	case errors.Is(err, client.ErrInsufficientUnits):
		return fmt.Sprintf("asked for %d unit(s): %v (use --wait to queue for units)", o.Units, err)
	}
	return err.Error()
}

// tellWaiting says once what gpurun waits for and how many units are free.
func tellWaiting(ctx context.Context, c *client.Client, o Options, stderr io.Writer) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(200 * time.Millisecond):
	}
	free := "unknown"
	if s, err := c.Snapshot(ctx); err == nil {
		free = strconv.Itoa(s.UnitsFree)
	}
	fmt.Fprintf(stderr, "gpurun: waiting up to %s for %d unit(s); %s free on the node now\n", o.Wait, o.Units, free)
}

func acquireOffline(o Options, stderr io.Writer) (map[string]string, func(), int) {
	runDir := offline.RunDir(o.RunDir)
	lay, err := offline.ReadLayout(runDir)
	if err != nil {
		fmt.Fprintln(stderr, "gpurun --offline:", err)
		return nil, nil, ExitFailure
	}
	cl, err := offline.Take(runDir, lay, offline.Request{Units: o.Units, GPU: o.GPU, Type: o.Type})
	if err != nil {
		fmt.Fprintln(stderr, "gpurun --offline:", err)
		return nil, nil, ExitFailure
	}
	env := map[string]string{LeaseIDEnv: "offline"}
	for k, v := range cl.Env {
		env[k] = v
	}
	return env, func() { cl.Release(runDir) }, 0
}

// mergeEnv is base with every variable of set replaced or added.
func mergeEnv(base []string, set map[string]string) []string {
	out := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			out = append(out, kv)
		}
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
