package cli

import (
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
}
