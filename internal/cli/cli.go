// Package cli is the gpulet command: see the node's units and leases, release
// leases, and drain the node, through gpuletd's socket API.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

const usage = `gpulet shows and manages the GPU units of this node through gpuletd.

Usage: gpulet [--socket PATH] COMMAND [flags]

Commands:
  status [--json]            one row per GPU: state, units used/offline/free, utilization, memory
  top [--interval D]         the status table, refreshed until Ctrl-C
  leases [--all] [--json]    your leases (--all: everyone's, as root or admin)
  release ID                 end a lease
  drain                      stop new leases on this node (admins)
  undrain                    resume new leases (admins)

The socket is --socket, else $GPULET_SOCKET, else ` + client.DefaultSocket + `.
`

// Main runs gpulet with args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	global := pflag.NewFlagSet("gpulet", pflag.ContinueOnError)
	global.SetOutput(stderr)
	global.SetInterspersed(false)
	socket := global.String("socket", "", "gpuletd's socket")
	global.Usage = func() { fmt.Fprint(stderr, usage+"\nGlobal flags:\n"+global.FlagUsages()) }
	if err := global.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintln(stderr, "gpulet:", err)
		return ExitUsage
	}
	rest := global.Args()
	if len(rest) == 0 {
		global.Usage()
		return ExitUsage
	}
	cmd, ok := commands[rest[0]]
	if !ok {
		fmt.Fprintf(stderr, "gpulet: unknown command %q\n\n", rest[0])
		global.Usage()
		return ExitUsage
	}
	fs := pflag.NewFlagSet("gpulet "+rest[0], pflag.ContinueOnError)
	fs.SetOutput(stderr)
	run := cmd.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gpulet %s %s\n\n%s\n", rest[0], cmd.args, cmd.help)
		if fs.HasFlags() {
			fmt.Fprint(stderr, "\nFlags:\n"+fs.FlagUsages())
		}
	}
	if err := fs.Parse(rest[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintln(stderr, "gpulet:", err)
		return ExitUsage
	}
	if n := len(fs.Args()); n != cmd.nargs {
		fmt.Fprintf(stderr, "gpulet %s: want %d argument(s), got %d\n", rest[0], cmd.nargs, n)
		fs.Usage()
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	env := &env{c: &client.Client{Socket: *socket}, out: stdout, args: fs.Args()}
	if err := run(ctx, env); err != nil {
		if ctx.Err() != nil {
			return ExitOK
		}
		fmt.Fprintln(stderr, "gpulet:", describe(err))
		return ExitFailure
	}
	return ExitOK
}

// describe prints an API error as "code: message", anything else as it is.
func describe(err error) string {
	if _, code := api.StatusOf(err); code != api.CodeInternal {
		return code + ": " + err.Error()
	}
	return err.Error()
}

type env struct {
	c    *client.Client
	out  io.Writer
	args []string
}

type command struct {
	args, help string
	nargs      int
	setup      func(fs *pflag.FlagSet) func(context.Context, *env) error
}

var commands = map[string]command{
	"status": {"[--json]", "Show one row per GPU: state, eligibility, units used/offline/free, utilization, memory.", 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, "print the snapshot exactly as gpuletd sent it")
			return func(ctx context.Context, e *env) error {
				if *asJSON {
					b, err := e.c.SnapshotJSON(ctx)
					if err != nil {
						return err
					}
					_, err = e.out.Write(b)
					return err
				}
				s, err := e.c.Snapshot(ctx)
				if err != nil {
					return err
				}
				WriteStatus(e.out, s)
				return nil
			}
		}},
	"top": {"[--interval D]", "Show the status table, refreshed until Ctrl-C.", 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			interval := fs.Duration("interval", time.Second, "refresh period")
			return func(ctx context.Context, e *env) error {
				if *interval < 100*time.Millisecond {
					return fmt.Errorf("--interval %s is too short (at least 100ms)", *interval)
				}
				t := time.NewTicker(*interval)
				defer t.Stop()
				for {
					s, err := e.c.Snapshot(ctx)
					if err != nil {
						return err
					}
					// Clear the screen and go home, as top does.
					fmt.Fprint(e.out, "\x1b[H\x1b[2J")
					WriteStatus(e.out, s)
					select {
					case <-ctx.Done():
						return nil
					case <-t.C:
					}
				}
			}
		}},
	"leases": {"[--all] [--json]", "List your leases; with --all, every lease gpuletd shows you (all of them for root and admins).", 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			all := fs.Bool("all", false, "every lease, not only your own")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, e *env) error {
				ls, err := e.c.Leases(ctx)
				if err != nil {
					return err
				}
				if !*all {
					uid := uint32(os.Getuid())
					mine := ls[:0]
					for _, l := range ls {
						if l.Owner.UID == uid {
							mine = append(mine, l)
						}
					}
					ls = mine
				}
				if *asJSON {
					return writeJSON(e.out, api.LeaseList{Leases: ls})
				}
				WriteLeases(e.out, ls)
				return nil
			}
		}},
	"release": {"ID", "End the lease ID.", 1,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				if err := e.c.Release(ctx, e.args[0]); err != nil {
					return err
				}
				fmt.Fprintf(e.out, "released %s\n", e.args[0])
				return nil
			}
		}},
	"drain": {"", "Stop new leases on this node; leases held now go on (root and the admin group).", 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				s, err := e.c.Drain(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.out, "node %s is %s: no new leases\n", s.Node, s.State)
				return nil
			}
		}},
	"undrain": {"", "Resume new leases on this node (root and the admin group).", 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				s, err := e.c.Undrain(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.out, "node %s is %s\n", s.Node, s.State)
				return nil
			}
		}},
}

// unitBar draws a GPU's units: # leased, o offline, r reserved, . free.
func unitBar(g api.GPU) string {
	leased := g.UnitsUsed - g.UnitsOffline
	var b strings.Builder
	b.WriteByte('[')
	b.WriteString(strings.Repeat("#", max(leased, 0)))
	b.WriteString(strings.Repeat("o", max(g.UnitsOffline, 0)))
	b.WriteString(strings.Repeat("r", max(g.UnitsReserved, 0)))
	b.WriteString(strings.Repeat(".", max(g.UnitsFree, 0)))
	b.WriteByte(']')
	return b.String()
}

// maxBar keeps the bar readable on GPUs with many units: past it, figures only.
const maxBar = 64

// WriteStatus prints the status table of a snapshot.
func WriteStatus(w io.Writer, s *api.Snapshot) {
	backend := s.Backend
	if backend == api.BackendSimulated {
		backend = "simulated (no real GPU)"
	}
	fmt.Fprintf(w, "node %s  state: %s  backend: %s  mps: %s\n", s.Node, s.State, backend, s.MPS)
	if s.View != nil {
		if s.View.Mounted {
			fmt.Fprintf(w, "view: %s\n", s.View.Mount)
		} else {
			fmt.Fprintf(w, "view: not mounted: %s\n", s.View.Error)
		}
	}
	tw := newTable(w, "GPU", "NAME", "STATE", "ELIGIBLE", "UNITS", "USED/OFFLINE/FREE", "UTIL", "MEMORY (MiB)", "MPS")
	for _, g := range s.GPUs {
		bar := unitBar(g)
		if g.UnitsTotal > maxBar {
			bar = "-"
		}
		var inst []string
		for _, in := range g.Instances {
			v := in.State
			if in.UID != nil {
				v += " uid " + strconv.FormatUint(uint64(*in.UID), 10)
			}
			inst = append(inst, fmt.Sprintf("%d:%s", in.Instance, v))
		}
		tw.row(strconv.Itoa(g.Index), g.Name, g.State, yesNo(g.Eligible), bar,
			fmt.Sprintf("%d/%d/%d", g.UnitsUsed, g.UnitsOffline, g.UnitsFree),
			fmt.Sprintf("%d%%", g.UtilizationPct), fmt.Sprintf("%d/%d", g.MemoryUsedMiB, g.MemoryTotalMiB), strings.Join(inst, " "))
	}
	tw.flush()
	fmt.Fprintf(w, "total: %d units, %d free, %d reserved   (# leased  o offline  r reserved  . free)\n", s.UnitsTotal, s.UnitsFree, s.UnitsReserved)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteLeases prints a lease table.
func WriteLeases(w io.Writer, ls []api.Lease) {
	if len(ls) == 0 {
		fmt.Fprintln(w, "no leases")
		return
	}
	tw := newTable(w, "ID", "GPU", "INSTANCE", "UNITS", "UID", "PID", "EXPIRES", "TASK")
	for _, l := range ls {
		units := make([]string, len(l.Units))
		for i, u := range l.Units {
			units[i] = strconv.Itoa(u)
		}
		exp, pid := "with process", strconv.Itoa(l.Owner.PID)
		if l.Expires != nil {
			exp = l.Expires.Local().Format(time.DateTime)
			pid = "-"
		}
		task := l.Task
		if task == "" {
			task = "-"
		}
		tw.row(l.ID, strconv.Itoa(l.GPU.Index), strconv.Itoa(l.Instance), strings.Join(units, ","),
			strconv.FormatUint(uint64(l.Owner.UID), 10), pid, exp, task)
	}
	tw.flush()
}
