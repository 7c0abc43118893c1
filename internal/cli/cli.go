// Package cli is the gpulet command: see the node's units and leases, release
// leases, and drain the node, through gpuletd's socket API; and check a
// gpuletd config file. It only reads and asks; every decision is gpuletd's,
// and it keeps no state of its own.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/version"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // an API error, or gpuletd not reachable
	ExitUsage   = 2
	// ExitInterrupted is a command other than top ended by SIGINT or SIGTERM.
	ExitInterrupted = 130
)

const usage = `gpulet shows and manages the GPU units of this node through gpuletd.

Usage: gpulet [--socket PATH] COMMAND [flags]
       gpulet --version

Commands:
  status [--json]            one row per GPU: state, units leased/offline/reserved/free, utilization, memory;
                             then the pools and your quota use, when the config has any;
                             then the free units you cannot lease now, and why
  gpus [--json]              one row per GPU: what it is (compute capability, memory, bandwidth, SM clock)
  profiles [--json]          the task–engine affinity table: run time per task and GPU model
  top [--interval D]         the status table, refreshed until Ctrl-C
  leases [--all] [--json]    your leases (--all: every lease of the node, with its user and command)
  release ID...              end leases
  release --slurm-job ID     end every lease of a Slurm job (root and gpuletd's --admin-group)
  drain                      stop new leases on this node (root and gpuletd's --admin-group)
  undrain [--gpu N]          resume new leases; with --gpu, clear that GPU's Xid fault
  reserve NAME --stages N,.. set aside units for a workflow [--share U:W,group:G:W] [--priority N] [--wait]
  reservations [--json]      the workflow reservations: stage, need, lent, reclaimed
  advance NAME [--json]      start a reservation's next stage (takes lent units back if needed)
  unreserve NAME             end a reservation; its units go back to the node
  config check FILE          check a gpuletd config file (pools, quotas, task profiles)
  slurm task-prolog|epilog|gres  Slurm's hooks, and the gres.conf lines of this node
  completion bash|zsh|fish   a shell completion script
  help [COMMAND]             this text, or a command's

Examples:
  gpulet status
  gpulet leases --all
  gpulet release l-3f2a9c0d1e2b4a5c
  gpulet reserve wf1 --stages 2,6,6,8 --share bob:1,group:ml:2
  gpulet status --json | jq '.gpus[] | {index, units_free}'

The socket is --socket, else $GPULET_SOCKET, else ` + client.DefaultSocket + `.
Errors print as one line, "gpulet: CODE: message", and exit 1; usage errors exit 2.
`

// env is what a command runs with.
type env struct {
	c      *client.Client
	out    io.Writer
	errOut io.Writer
	args   []string
}

type command struct {
	args, help string
	// minArgs and maxArgs bound the positional arguments; maxArgs < 0: any.
	minArgs, maxArgs int
	// setup defines the command's flags and returns what runs it.
	setup func(fs *pflag.FlagSet) func(context.Context, *env) error
}

// Run runs gpulet with args and returns the exit code. ctx ends on SIGINT or
// SIGTERM: top then exits 0, any other command 130.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	global := pflag.NewFlagSet("gpulet", pflag.ContinueOnError)
	global.SetOutput(stderr)
	// Flags after the command name are the command's.
	global.SetInterspersed(false)
	socket := global.String("socket", "", "gpuletd's socket")
	showVersion := global.Bool("version", false, "print gpulet's version and commit")
	global.Usage = func() { fmt.Fprint(stdout, usage) }
	if err := global.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		return usageError(stderr, "%v", err)
	}
	if *showVersion {
		version.Print(stdout, "gpulet")
		return ExitOK
	}
	rest := global.Args()
	if len(rest) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	name := rest[0]
	if name == "help" {
		return help(rest[1:], stdout, stderr)
	}
	cmd, ok := commands[name]
	if !ok {
		if near := suggest(name); near != "" {
			return usageError(stderr, "unknown command %q: did you mean %s?", name, near)
		}
		return usageError(stderr, "unknown command %q", name)
	}
	fs := newFlagSet(name, cmd, stdout, stderr)
	// Each command takes --socket too, so that it may come after the name.
	fs.StringVar(socket, "socket", *socket, "gpuletd's socket (default $GPULET_SOCKET, else "+client.DefaultSocket+")")
	run := cmd.setup(fs)
	if err := fs.Parse(rest[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		return commandUsageError(stderr, name, "%v", err)
	}
	if n := fs.NArg(); n < cmd.minArgs || cmd.maxArgs >= 0 && n > cmd.maxArgs {
		return commandUsageError(stderr, name, "wrong number of arguments: gpulet %s %s", name, cmd.args)
	}
	e := &env{c: &client.Client{Socket: *socket}, out: stdout, errOut: stderr, args: fs.Args()}
	if err := run(ctx, e); err != nil {
		var ue usageErr
		if errors.As(err, &ue) {
			return commandUsageError(stderr, name, "%s", ue)
		}
		if ctx.Err() != nil {
			if name == "top" {
				return ExitOK
			}
			fmt.Fprintln(stderr, "gpulet: interrupted")
			return ExitInterrupted
		}
		fmt.Fprintln(stderr, "gpulet:", describe(e.c, err))
		return ExitFailure
	}
	return ExitOK
}

// describe prints an API error as "CODE: message", anything else as it is.
func describe(c *client.Client, err error) string {
	// An error's message may quote what a peer sent or another user named.
	msg := Printable(err.Error())
	switch {
	case errors.Is(err, client.ErrPermission), errors.Is(err, client.ErrSocketPathTooLong):
		return msg
	case errors.Is(err, client.ErrNoDaemon):
		if hint := c.NoDaemonHint(os.Getenv); hint != "" {
			return msg + "\n  " + hint
		}
		return msg + "\n  start gpuletd (systemctl start gpuletd), or point --socket or GPULET_SOCKET at its socket"
	}
	if _, code := api.StatusOf(err); code != api.CodeInternal {
		return Printable(code) + ": " + msg
	}
	return msg
}

var commands = map[string]command{
	"status": {"[--json]", "Show one row per GPU: state, eligibility, a bar of its units (# leased, o offline,\nr reserved, . free), utilization and memory; then the node's totals; then, when\ngpuletd's --config has any, the pools (their GPUs, free units, and whether you may\nuse them) and the quotas that bind you with what you hold; last, the free units you\ncannot lease now and why (another user's MPS server, a pool not yours, your quota\nat its limit).", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, "print the snapshot exactly as gpuletd sent it")
			return func(ctx context.Context, e *env) error {
				if *asJSON {
					b, err := e.c.SnapshotJSON(ctx)
					if err != nil {
						return err
					}
					_, err = e.out.Write(printableJSON(b))
					return err
				}
				s, err := e.c.Snapshot(ctx)
				if err != nil {
					return err
				}
				WriteStatus(e.out, s)
				pools, err := e.c.Pools(ctx)
				if err != nil {
					return err
				}
				quotas, err := e.c.Quotas(ctx)
				if err != nil {
					return err
				}
				writeAccess(e.out, pools, quotas)
				writeNotForYou(e.out, notForYou(s, pools, quotas, uint32(os.Getuid())))
				return nil
			}
		}},
	"gpus": {"[--json]", "Show one row per GPU: what the card is, as placement's min_cc filter and score\npolicy see it (compute capability, memory, peak memory bandwidth, boost SM clock), and\nits units free. A figure the driver does not report shows as -.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, `print {"backend","mps","gpus":[...]} as GET /v1/gpus answers`)
			return func(ctx context.Context, e *env) error {
				l, err := e.c.GPUs(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.out, l)
				}
				WriteGPUs(e.out, l)
				return nil
			}
		}},
	"top": {"[--interval D]", "Show the status table, refreshed every --interval until Ctrl-C.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			interval := fs.Duration("interval", time.Second, "refresh period")
			return func(ctx context.Context, e *env) error {
				if *interval < 100*time.Millisecond {
					return usageErr(fmt.Sprintf("--interval %s is too short (at least 100ms)", *interval))
				}
				return top(ctx, e, *interval)
			}
		}},
	"leases": {"[--all] [--json]", "List your leases, with the user and command of each. With --all, every lease of the\nnode: other users' show who holds them and where, but not their ids (gpuletd's\n--private-leases shows users who are not admins their own alone).", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			all := fs.Bool("all", false, "every lease gpuletd shows you, not only your own")
			asJSON := fs.Bool("json", false, `print {"leases":[...]} as the API does`)
			return func(ctx context.Context, e *env) error {
				list := e.c.Leases
				if *all {
					list = e.c.LeasesAll
				}
				ls, err := list(ctx)
				if err != nil {
					return err
				}
				hidden := 0
				if !*all {
					ls, hidden = ownLeases(ls, uint32(os.Getuid()))
				}
				if *asJSON {
					return writeJSON(e.out, api.LeaseList{Leases: ls})
				}
				WriteLeases(e.out, ls)
				if *all {
					// Offline claims are no leases: the snapshot lists them.
					s, err := e.c.Snapshot(ctx)
					if err != nil {
						return err
					}
					WriteClaims(e.out, s)
				}
				if hidden > 0 {
					fmt.Fprintf(e.errOut, "gpulet: %d lease(s) of other users not shown; --all shows them\n", hidden)
				}
				return nil
			}
		}},
	"release": {"ID... | --slurm-job ID", "End the leases named; their units are free at once. With --slurm-job, end every\nlease of that Slurm job (root and gpuletd's --admin-group).", 0, -1,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			job := fs.Uint64("slurm-job", 0, "end every lease of this Slurm job instead")
			return func(ctx context.Context, e *env) error {
				if fs.Changed("slurm-job") != (len(e.args) == 0) {
					return usageErr("wrong number of arguments: gpulet release ID... | --slurm-job ID")
				}
				if fs.Changed("slurm-job") {
					return releaseSlurmJob(ctx, e, *job)
				}
				var errs []error
				for _, id := range e.args {
					if err := e.c.Release(ctx, id); err != nil {
						if ctx.Err() != nil {
							return err
						}
						errs = append(errs, err)
						// With several ids, each failure gets its line and the
						// others are still released.
						if len(e.args) > 1 {
							fmt.Fprintln(e.errOut, "gpulet:", Printable(id)+":", describe(e.c, err))
						}
						continue
					}
					fmt.Fprintf(e.out, "released %s\n", Printable(id))
				}
				switch {
				case len(errs) == 1 && len(e.args) == 1:
					return errs[0]
				case len(errs) > 0:
					return fmt.Errorf("%d of %d lease(s) not released", len(errs), len(e.args))
				}
				return nil
			}
		}},
	"drain": {"", "Stop new leases on this node; leases held now go on. Root and gpuletd's\n--admin-group only.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				s, err := e.c.Drain(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.out, "node %s is %s: no new leases; %d of %d units in use go on\n", Printable(s.Node), Printable(s.State), s.UnitsTotal-s.UnitsFree-s.UnitsReserved, s.UnitsTotal)
				return nil
			}
		}},
	"undrain": {"[--gpu N|UUID]", "Resume new leases on this node. With --gpu, clear instead the Xid fault that failed\nthat GPU, so that it takes leases again; the node's draining stays as it is. A GPU\nstill failed for another reason (an NVML error) stays failed. Root and gpuletd's\n--admin-group only.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			gpu := fs.String("gpu", "", "the GPU (index or UUID) whose Xid fault to clear")
			return func(ctx context.Context, e *env) error {
				if fs.Changed("gpu") {
					if strings.TrimSpace(*gpu) == "" {
						return usageErr("--gpu is empty: give a GPU index or UUID")
					}
					s, err := e.c.UndrainGPU(ctx, *gpu)
					if err != nil {
						return err
					}
					return gpuCleared(e.out, s, *gpu)
				}
				s, err := e.c.Undrain(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.out, "node %s is %s: %d of %d units free\n", Printable(s.Node), Printable(s.State), s.UnitsFree, s.UnitsTotal)
				return nil
			}
		}},
	"slurm": slurmCommand,
	"config": {"check FILE", "Check a gpuletd config file (pools, quotas, task profiles, score weights): its\nform, and the users and groups it names against this machine's user database.\nThe GPUs it names are checked against gpuletd's when gpuletd answers on the\nsocket; otherwise only their form is, and a line on stderr says so. Prints\n\"FILE: ok (...)\" and exits 0, or prints the first problem with its line and\nexits 1.", 2, 2,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				if e.args[0] != "check" {
					return usageErr(fmt.Sprintf("no subcommand %q: gpulet config check FILE", e.args[0]))
				}
				return checkConfig(ctx, e, e.args[1])
			}
		}},
}

// warnModels says which GPU models the file's task profiles name that the
// node has none of: likely a typo, since profiles match NVML's names exactly.
func warnModels(e *env, path string, f *config.File, gpus []api.GPU) {
	var names []string
	for _, g := range gpus {
		names = append(names, g.Name)
	}
	if missing := f.ModelsNotIn(names); len(missing) > 0 {
		slices.Sort(names)
		fmt.Fprintf(e.errOut, "gpulet: %s: warning: task profiles name GPU models this node has none of: %s (its GPUs are named %s, as NVML names them)\n",
			Printable(path), Printable(quoteAll(missing)), Printable(quoteAll(slices.Compact(names))))
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// gpusTimeout bounds the wait for gpuletd's GPUs in config check: a daemon
// that hangs should not hang a check that can do without it.
const gpusTimeout = 5 * time.Second

// checkConfig checks the config file at path: its form, the users and groups
// it names against this machine's user database, and the GPUs it names
// against gpuletd's, when gpuletd answers.
func checkConfig(ctx context.Context, e *env, path string) error {
	f, err := config.Load(path)
	if err != nil {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, gpusTimeout)
	list, err := e.c.GPUs(gctx)
	cancel()
	switch {
	case err == nil:
		gpus := make([]config.GPURef, len(list.GPUs))
		for i, g := range list.GPUs {
			gpus[i] = config.GPURef{Index: g.Index, UUID: g.UUID}
		}
		// Strict: a name that gpuletd would skip is a problem here.
		err = f.Check(gpus, identity.SystemDirectory{})
		warnModels(e, path, f, list.GPUs)
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("gpuletd at %s did not answer within %s", e.c.SocketPath(), gpusTimeout)
		}
		fmt.Fprintf(e.errOut, "gpulet: %s: GPUs not checked against a node, only their form: %v\n", path, err)
		err = f.CheckNames(identity.SystemDirectory{})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(e.out, "%s: ok (%s, %s, %s)\n", path, count(len(f.Pools), "pool"), count(len(f.Quotas), "quota"), count(len(f.Profiles), "task profile"))
	return nil
}

// count writes "1 pool", "2 pools".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// gpuCleared says what became of the GPU whose Xid fault was cleared: an
// error if it is still failed, for another reason.
func gpuCleared(w io.Writer, s *api.Snapshot, name string) error {
	for _, g := range s.GPUs {
		if strconv.Itoa(g.Index) != name && !strings.EqualFold(g.UUID, name) {
			continue
		}
		if g.State == api.GPUFailed {
			return fmt.Errorf("GPU %d (%s) has no Xid fault now but is still failed: %s", g.Index, g.UUID, g.Error)
		}
		fmt.Fprintf(w, "GPU %d (%s): no Xid fault now; state %s, eligible %s\n", g.Index, Printable(g.UUID), Printable(g.State), yesNo(g.Eligible))
		if s.State == api.NodeDraining {
			fmt.Fprintf(w, "node %s is still draining: gpulet undrain resumes new leases\n", Printable(s.Node))
		}
		return nil
	}
	return fmt.Errorf("GPU %q is not in gpuletd's answer", name)
}

// ownLeases keeps the leases of uid and counts the others.
func ownLeases(ls []api.Lease, uid uint32) ([]api.Lease, int) {
	mine := []api.Lease{}
	for _, l := range ls {
		if l.Owner.UID == uid {
			mine = append(mine, l)
		}
	}
	return mine, len(ls) - len(mine)
}

// top redraws the status table every interval. A failure after the first
// table is shown in place and retried, so that top outlives a restart of
// gpuletd.
func top(ctx context.Context, e *env, interval time.Duration) error {
	tty := isTerminal(e.out)
	t := time.NewTicker(interval)
	defer t.Stop()
	for first := true; ; first = false {
		s, err := e.c.Snapshot(ctx)
		if err != nil && (first || ctx.Err() != nil) {
			return err
		}
		var frame strings.Builder
		if tty {
			// Home and clear, as top(1) does; elsewhere frames follow each other.
			frame.WriteString("\x1b[H\x1b[2J")
		} else if !first {
			frame.WriteString("\n")
		}
		fmt.Fprintf(&frame, "%s  every %s, Ctrl-C ends\n", time.Now().Format(time.TimeOnly), interval)
		if err != nil {
			fmt.Fprintf(&frame, "gpulet: %s (retrying)\n", describe(e.c, err))
		} else {
			WriteStatus(&frame, s)
		}
		io.WriteString(e.out, frame.String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
