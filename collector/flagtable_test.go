package collector

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/internal/flaghelp"
)

// The table of gpulet-collector's flags in docs/collector.md (linked from
// the README) is what operators read instead of --help; these tests hold it
// to the flags ParseFlags defines, and both to flagGroups.

func collectorHelp(t *testing.T) string {
	t.Helper()
	var out, errs strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out, &errs); !errors.Is(err, ErrHelp) || errs.Len() != 0 {
		t.Fatalf("ParseFlags(--help): err = %v, stderr %q; want ErrHelp and the help on stdout alone", err, errs.String())
	}
	return out.String()
}

func collectorFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("gpulet-collector", pflag.ContinueOnError)
	defineFlags(fs, &Config{})
	return fs
}

func TestFlagTableMatchesFlags(t *testing.T) {
	page, err := os.Open("../docs/collector.md")
	if err != nil {
		t.Fatal(err)
	}
	defer page.Close()
	rows, docGroups, problems, err := flaghelp.DocTable(page, "## Flags")
	if err != nil {
		t.Fatalf("docs/collector.md: %v", err)
	}
	help := collectorHelp(t)
	helpFlags, helpGroups := flaghelp.ReadHelp(help)
	problems = append(problems, flaghelp.CheckTable("gpulet-collector", helpFlags, rows, nil)...)
	problems = append(problems, flaghelp.CompareGroups(flagGroups, "flagGroups", docGroups, "the table in docs/collector.md")...)
	problems = append(problems, flaghelp.CompareGroups(flagGroups, "flagGroups", helpGroups, "--help")...)
	problems = append(problems, flaghelp.GroupProblems(collectorFlagSet(), flagGroups, "flagGroups")...)
	problems = append(problems, flaghelp.ShapeProblems(help, collectorFlagSet())...)
	for _, p := range problems {
		t.Error(p)
	}
}

// Each bad command line is refused, said once, with the command's name.
func TestParseFlagsRefuses(t *testing.T) {
	for args, want := range map[string]string{
		"":                        "--listen is required",
		"--listen :1 extra":       "unexpected arguments: [extra]",
		"--listen :1 --policy no": `--policy "no"`,
		"--listen :1 --bogus":     "unknown flag: --bogus",
	} {
		var out, errs strings.Builder
		_, err := ParseFlags(strings.Fields(args), &out, &errs)
		if err == nil || out.Len() != 0 || !strings.HasPrefix(errs.String(), "gpulet-collector: ") || !strings.Contains(errs.String(), want) || strings.Count(errs.String(), "\n") != 1 {
			t.Errorf("%q: err %v, printed %q on stdout and %q on stderr; want one line on stderr saying %q", args, err, out.String(), errs.String(), want)
		}
	}
	cfg, err := ParseFlags([]string{"--listen", ":9410", "--policy", "spread", "--stale-after", "30s"}, &strings.Builder{}, &strings.Builder{})
	if err != nil || cfg.Listen != ":9410" || cfg.Policy != "spread" || cfg.StaleAfter.String() != "30s" || cfg.MaxNodes != DefaultMaxNodes {
		t.Errorf("ParseFlags = %+v, %v", cfg, err)
	}
}
