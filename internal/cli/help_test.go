package cli

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Each command's usage line ("Usage: gpulet NAME ARGS", and the line a
// wrong number of arguments prints) names every flag the command takes, but
// --socket, which every command takes.
func TestUsageLineNamesEveryFlag(t *testing.T) {
	for name, cmd := range commands {
		fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
		cmd.setup(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(cmd.args, "--"+f.Name) {
				t.Errorf("gpulet %s: usage line %q does not name --%s", name, cmd.args, f.Name)
			}
		})
	}
}

// gpulet help and the README's synopsis of gpulet list every command.
func TestEveryCommandIsListed(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range commands {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + `\b`).MatchString(usage) {
			t.Errorf("gpulet help does not list %s", name)
		}
		if !regexp.MustCompile(`(?m)^gpulet (\[--socket PATH\] )?` + regexp.QuoteMeta(name) + `\b`).Match(readme) {
			t.Errorf("README's gpulet synopsis does not list %s", name)
		}
	}
	for name, subs := range subcommands {
		for _, sub := range subs {
			if !strings.Contains(commands[name].args, sub) {
				t.Errorf("gpulet %s: usage line %q does not name its subcommand %s", name, commands[name].args, sub)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"help of help", []string{"help", "help"}, ExitOK, "Commands:", ""},
		{"help --help", []string{"help", "--help"}, ExitOK, "Commands:", ""},
		{"help of a subcommand", []string{"help", "config", "check"}, ExitOK, "Usage: gpulet config check FILE", ""},
		{"help of a Slurm hook", []string{"help", "slurm", "gres"}, ExitOK, "--dev-prefix", ""},
		{"help of an unknown subcommand", []string{"help", "config", "lint"}, ExitUsage, "", `help: no command "config lint"`},
		{"help of a command that has no subcommands", []string{"help", "status", "check"}, ExitUsage, "", `help: no command "status check"`},
		{"no blank after a usage without arguments", []string{"help", "drain"}, ExitOK, "Usage: gpulet drain\n", ""},
		{"advance names --json", []string{"help", "advance"}, ExitOK, "Usage: gpulet advance NAME [--json]\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("gpulet %q: exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
