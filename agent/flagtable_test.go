package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/internal/flaghelp"
)

// The gpuletd flag table in docs/gpuletd.md (linked from the README) is what
// operators read instead of --help; these tests hold it to the flags
// ParseFlags defines, and both to gpuletdFlagGroups (package flaghelp reads
// them back and compares).

// gpuletdHelp runs gpuletd --help and reads every flag and its default back
// from it, and the groups.
func gpuletdHelp(t *testing.T) (map[string]flaghelp.Flag, []flaghelp.Group) {
	t.Helper()
	var out strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out); !errors.Is(err, ErrHelp) {
		t.Fatalf("ParseFlags(--help): err = %v, want ErrHelp", err)
	}
	flags, groups := flaghelp.ReadHelp(out.String())
	if len(flags) == 0 {
		t.Fatalf("no flag read from --help:\n%s", out.String())
	}
	return flags, groups
}

// computedDefaults are the flags whose default is worked out at start, so
// that pflag shows none (or this host's value): docs/gpuletd.md names each in
// words, and check says whether the Config that no flags give matches them.
var computedDefaults = map[string]struct {
	doc   string
	check func(c Config) error
}{
	"mount": {"`<run-dir>/view`", func(c Config) error {
		if c.Mount != c.RunDir+"/view" {
			return fmt.Errorf("mount %q, run dir %q", c.Mount, c.RunDir)
		}
		return nil
	}},
	"units-per-gpu": {"`16`", func(c Config) error {
		if c.Model.UnitsPerGPU != 16 {
			return fmt.Errorf("U = %d", c.Model.UnitsPerGPU)
		}
		return nil
	}},
	"units-per-client": {"U", func(c Config) error {
		if m := c.Model; m.UnitsPerClient != m.UnitsPerGPU {
			return fmt.Errorf("M = %d, U = %d", m.UnitsPerClient, m.UnitsPerGPU)
		}
		return nil
	}},
	"node-name": {"host name", func(c Config) error {
		if host, err := os.Hostname(); err != nil || c.NodeName != host {
			return fmt.Errorf("node name %q, host name %q (%v)", c.NodeName, host, err)
		}
		return nil
	}},
}

func TestFlagTableMatchesFlags(t *testing.T) {
	page, err := os.Open("../docs/gpuletd.md")
	if err != nil {
		t.Fatal(err)
	}
	defer page.Close()
	defaults, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("ParseFlags with no arguments: %v", err)
	}
	rows, docGroups, problems, err := flaghelp.DocTable(page, "## Flags")
	if err != nil {
		t.Fatalf("docs/gpuletd.md: %v", err)
	}
	words := map[string]string{}
	for name, c := range computedDefaults {
		words[name] = c.doc
		if err := c.check(defaults); err != nil {
			problems = append(problems, fmt.Sprintf("--%s default is not %s: %v", name, c.doc, err))
		}
	}
	helpFlags, helpGroups := gpuletdHelp(t)
	problems = append(problems, flaghelp.CheckTable("gpuletd", helpFlags, rows, words)...)
	problems = append(problems, flaghelp.CompareGroups(gpuletdFlagGroups, "gpuletdFlagGroups", docGroups, "the table in docs/gpuletd.md")...)
	problems = append(problems, flaghelp.CompareGroups(gpuletdFlagGroups, "gpuletdFlagGroups", helpGroups, "--help")...)
	for _, p := range problems {
		t.Error(p)
	}
}

// gpuletdFlagSet is a FlagSet with gpuletd's flags defined.
func gpuletdFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("gpuletd", pflag.ContinueOnError)
	defineFlags(fs, &Config{}, &rawFlags{})
	return fs
}

// TestEveryFlagInOneGroup holds gpuletdFlagGroups to the flags defined: a
// flag added without a group fails here (and in the check of docs/gpuletd.md).
func TestEveryFlagInOneGroup(t *testing.T) {
	for _, p := range flaghelp.GroupProblems(gpuletdFlagSet(), gpuletdFlagGroups, "gpuletdFlagGroups") {
		t.Error(p)
	}
	for name := range gpuletdComputedDefaults {
		if gpuletdFlagSet().Lookup(name) == nil {
			t.Errorf("gpuletdComputedDefaults names --%s, which is no flag", name)
		}
	}
}
