package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/client"
)

// subcommands are the words that may follow a command's name, so that
// "gpulet help config check" shows config's usage as "gpulet help config"
// does.
var subcommands = map[string][]string{
	"config": {"check"},
	"slurm":  {"task-prolog", "epilog", "gres"},
}

func newFlagSet(name string, cmd command, stdout, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("gpulet "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: %s\n\n%s\n", strings.TrimSpace("gpulet "+name+" "+cmd.args), cmd.help)
		if fs.HasFlags() {
			fmt.Fprint(stdout, "\nFlags:\n"+fs.FlagUsages())
		}
	}
	return fs
}

// usageErr is a usage error found by a command's run, such as an unknown
// subcommand: it exits ExitUsage as those found by Run do.
type usageErr string

func (e usageErr) Error() string { return string(e) }

// usageError prints a usage error that belongs to no one command, and where
// the usage is.
func usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "gpulet: "+format+"\nRun 'gpulet help' for usage.\n", args...)
	return ExitUsage
}

// commandUsageError prints a usage error of command name, "name: " before
// it, and points at that command's usage rather than the list of commands.
func commandUsageError(stderr io.Writer, name, format string, args ...any) int {
	fmt.Fprintf(stderr, "gpulet: %s: %s\nRun 'gpulet help %s' for usage.\n", name, fmt.Sprintf(format, args...), name)
	return ExitUsage
}

// help prints the usage, or one command's. A command's subcommand may follow
// its name (help config check), and help of help is the usage.
func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || len(args) == 1 && slices.Contains([]string{"help", "--help", "-h"}, args[0]) {
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	cmd, ok := commands[args[0]]
	if !ok || len(args) > 2 || len(args) == 2 && !slices.Contains(subcommands[args[0]], args[1]) {
		return usageError(stderr, "help: no command %q", strings.Join(args, " "))
	}
	fs := newFlagSet(args[0], cmd, stdout, stderr)
	fs.String("socket", "", "gpuletd's socket (default $GPULET_SOCKET, else "+client.DefaultSocket+")")
	cmd.setup(fs)
	fs.Usage()
	return ExitOK
}
