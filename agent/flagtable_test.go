package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The README's gpuletd flag table is what operators read instead of --help;
// these tests hold it to the flags ParseFlags defines.

// helpFlag is one flag as gpuletd --help lists it.
type helpFlag struct {
	kind string // pflag's type word: string, int, duration, stringArray; "bool" for a bool
	// def is the default pflag prints, unquoted; empty where pflag prints
	// none, which it does for a zero value (false, 0, "", no elements).
	def string
}

// helpLine matches one flag line of --help: "  --name type  usage (default
// D)", where a bool shows no type. pflag's own listing would match too.
var helpLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?:\[=[^\]]*\])?(?: (\w+))?\s{2,}(.*)$`)

// printedDefault matches the "(default X)" --help appends to a usage.
var printedDefault = regexp.MustCompile(` \(default (.*)\)$`)

// helpHeading matches a group's heading in --help: "Title:" at the start of
// a line.
var helpHeading = regexp.MustCompile(`^(\S.*):$`)

// gpuletdHelp runs gpuletd --help and reads every flag and its default back
// from it, and the groups: each heading with the flags under it, in order.
// A usage may itself end in words such as "(default M×N×K)" where the
// printed default is a word (the zero value stands for a computed default):
// a string default is quoted and a number, duration or list is written as
// its type writes it, so only a value that parses as the flag's type counts
// as a default.
func gpuletdHelp(t *testing.T) (map[string]helpFlag, []flagGroup) {
	t.Helper()
	var out strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out); !errors.Is(err, ErrHelp) {
		t.Fatalf("ParseFlags(--help): err = %v, want ErrHelp", err)
	}
	flags, groups := readHelp(out.String())
	if len(flags) == 0 {
		t.Fatalf("no flag read from --help:\n%s", out.String())
	}
	return flags, groups
}

// readHelp reads --help's text; a flag before any heading is in a group
// titled "".
func readHelp(help string) (map[string]helpFlag, []flagGroup) {
	flags := map[string]helpFlag{}
	var groups []flagGroup
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		if h := helpHeading.FindStringSubmatch(sc.Text()); h != nil {
			groups = append(groups, flagGroup{title: h[1]})
			continue
		}
		m := helpLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := helpFlag{kind: m[2]}
		if f.kind == "" {
			f.kind = "bool"
		}
		if d := printedDefault.FindStringSubmatch(m[3]); d != nil {
			f.def = typedDefault(f.kind, d[1])
		}
		flags[m[1]] = f
		if len(groups) == 0 {
			groups = append(groups, flagGroup{})
		}
		g := &groups[len(groups)-1]
		g.flags = append(g.flags, m[1])
	}
	return flags, groups
}

// typedDefault returns printed as a default of a flag of type kind, or ""
// when printed is prose of the usage rather than a value pflag wrote.
func typedDefault(kind, printed string) string {
	switch kind {
	case "string":
		if s, err := strconv.Unquote(printed); err == nil && strings.HasPrefix(printed, `"`) {
			return s
		}
	case "int":
		if _, err := strconv.Atoi(printed); err == nil {
			return printed
		}
	case "duration":
		if _, err := time.ParseDuration(printed); err == nil {
			return printed
		}
	case "bool":
		if printed == "true" {
			return printed
		}
	case "stringArray":
		if strings.HasPrefix(printed, "[") && strings.HasSuffix(printed, "]") {
			return printed
		}
	}
	return ""
}

// readmeRow is one row of the README's gpuletd flag table.
type readmeRow struct {
	line int
	def  string // the default cell as written
}

// readmeGroupRow matches a row of the README's flag table that heads a
// group: "| **Title** | | |".
var readmeGroupRow = regexp.MustCompile(`^\| \*\*([^*]+)\*\* \| +\| +\|$`)

// readmeFlagTable reads the flag table of the README's "## gpuletd" section:
// the rows after the header "| flag | default | meaning |" up to the first
// line that is not a table row. It returns the rows by flag name, the groups
// (each heading row with the flag rows under it, in order; a flag row before
// any heading row is in a group titled ""), and each row that is neither a
// heading's nor a flag's or names a flag a second time.
func readmeFlagTable(readme io.Reader) (map[string]readmeRow, []flagGroup, []string, error) {
	rows := map[string]readmeRow{}
	var (
		groups []flagGroup
		bad    []string
	)
	sc := bufio.NewScanner(readme)
	section, table := false, false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## gpuletd"
			table = false
		case section && line == "| flag | default | meaning |":
			table = true
		case table && strings.HasPrefix(line, "| --- "):
		case table && readmeGroupRow.MatchString(line):
			groups = append(groups, flagGroup{title: readmeGroupRow.FindStringSubmatch(line)[1]})
		case table && strings.HasPrefix(line, "| "):
			cells := strings.SplitN(strings.TrimPrefix(line, "| "), " | ", 3)
			name, ok := strings.CutPrefix(strings.Trim(cells[0], "`"), "--")
			if len(cells) < 3 || !ok || !strings.HasPrefix(cells[0], "`") {
				bad = append(bad, fmt.Sprintf("README line %d: neither a group's row (| **Title** | | |) nor a flag's (| `--flag` | default | meaning |): %s", n, line))
				continue
			}
			if prev, dup := rows[name]; dup {
				bad = append(bad, fmt.Sprintf("README line %d: --%s is in the table already (line %d)", n, name, prev.line))
			}
			rows[name] = readmeRow{line: n, def: cells[1]}
			if len(groups) == 0 {
				groups = append(groups, flagGroup{})
			}
			g := &groups[len(groups)-1]
			g.flags = append(g.flags, name)
		case table:
			table = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil, errors.New("no gpuletd flag table (a \"| flag | default | meaning |\" table under \"## gpuletd\")")
	}
	return rows, groups, bad, nil
}

// computedDefaults are the flags whose default is worked out at start, so
// that pflag shows none (or this host's value): the README names each in
// words, and check says whether the Config that no flags give matches them.
var computedDefaults = map[string]struct {
	readme string
	check  func(c Config) error
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

// checkFlagTable returns each disagreement between the flags --help lists
// and the README's table rows.
func checkFlagTable(flags map[string]helpFlag, rows map[string]readmeRow, defaults Config) []string {
	var bad []string
	for name := range flags {
		if _, ok := rows[name]; !ok {
			bad = append(bad, fmt.Sprintf("--%s is a gpuletd flag but has no row in the README's table", name))
		}
	}
	for name, row := range rows {
		f, ok := flags[name]
		if !ok {
			bad = append(bad, fmt.Sprintf("README line %d: --%s is no gpuletd flag", row.line, name))
			continue
		}
		if c, computed := computedDefaults[name]; computed {
			if row.def != c.readme {
				bad = append(bad, fmt.Sprintf("README line %d: --%s default %s, want %s (computed at start)", row.line, name, row.def, c.readme))
			}
			if err := c.check(defaults); err != nil {
				bad = append(bad, fmt.Sprintf("--%s default is not %s: %v", name, c.readme, err))
			}
			continue
		}
		var want string
		switch {
		case f.def != "":
			want = "`" + f.def + "`"
		case f.kind == "bool":
			want = "off"
		case f.kind == "string" || f.kind == "stringArray":
			want = "none"
		default:
			want = "`" + "0" + "`"
		}
		if row.def != want {
			bad = append(bad, fmt.Sprintf("README line %d: --%s default %s, but the flag's is %s", row.line, name, row.def, want))
		}
	}
	sort.Strings(bad)
	return bad
}

func TestReadmeFlagTableMatchesFlags(t *testing.T) {
	readme, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer readme.Close()
	defaults, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("ParseFlags with no arguments: %v", err)
	}
	rows, readmeGroups, problems, err := readmeFlagTable(readme)
	if err != nil {
		t.Fatalf("README: %v", err)
	}
	helpFlags, helpGroups := gpuletdHelp(t)
	problems = append(problems, checkFlagTable(helpFlags, rows, defaults)...)
	problems = append(problems, compareGroups(gpuletdFlagGroups, "gpuletdFlagGroups", readmeGroups, "the README's table")...)
	problems = append(problems, compareGroups(gpuletdFlagGroups, "gpuletdFlagGroups", helpGroups, "--help")...)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckFlagTableFindsDisagreements feeds the check a README that
// disagrees with the flags in every way it can, so that the check above
// cannot pass by finding nothing.
func TestCheckFlagTableFindsDisagreements(t *testing.T) {
	flags, _ := gpuletdHelp(t)
	defaults, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"socket", "sample-interval", "max-utilization", "kubelet-plugin", "upstream", "mount", "node-name"} {
		if _, ok := flags[name]; !ok {
			t.Fatalf("--help lists no --%s", name)
		}
	}
	readme := "## gpuletd\n\n| flag | default | meaning |\n| --- | --- | --- |\n" +
		"| `--socket` | `/run/gpulet/other.sock` | a default that is not the flag's |\n" +
		"| `--sample-interval` | `2s` | a duration that is not the flag's |\n" +
		"| `--max-utilization` | `90` | right |\n" +
		"| `--kubelet-plugin` | on | a bool that is off |\n" +
		"| `--upstream` | `http://x` | a list that is empty |\n" +
		"| `--mount` | `/run/gpulet/view` | a computed default written as a value |\n" +
		"| `--node-name` | host name | right |\n" +
		"| `--no-such-flag` | none | a row of no flag |\n" +
		"| `--max-utilization` | `90` | a row given twice |\n" +
		"\n## next\n"
	rows, _, rowProblems, err := readmeFlagTable(strings.NewReader(readme))
	if err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(append(rowProblems, checkFlagTable(flags, rows, defaults)...), "\n")
	var missed []string
	for _, want := range []string{
		"--socket default `/run/gpulet/other.sock`",
		"--sample-interval default `2s`",
		"--kubelet-plugin default on",
		"--upstream default `http://x`",
		"--mount default `/run/gpulet/view`",
		"--no-such-flag is no gpuletd flag",
		"--backend is a gpuletd flag but has no row",
		"--max-utilization is in the table already",
	} {
		if !strings.Contains(problems, want) {
			missed = append(missed, "not reported: "+want)
		}
	}
	for _, right := range []string{"--max-utilization default", "--node-name default"} {
		if strings.Contains(problems, right) {
			missed = append(missed, "reported though right: "+right)
		}
	}
	for _, m := range missed {
		t.Error(m)
	}
	if t.Failed() {
		t.Logf("problems found:\n%s", problems)
	}
}

// groupLines writes groups one a line, "Title: flag, flag", for comparing.
func groupLines(groups []flagGroup) []string {
	lines := make([]string, len(groups))
	for i, g := range groups {
		lines[i] = g.title + ": " + strings.Join(g.flags, ", ")
	}
	return lines
}

// compareGroups returns each group in which got differs from want: its title,
// its flags or their order, and each group one has and the other lacks.
func compareGroups(want []flagGroup, wantName string, got []flagGroup, gotName string) []string {
	w, g := groupLines(want), groupLines(got)
	var problems []string
	for i := range max(len(w), len(g)) {
		switch {
		case i >= len(g):
			problems = append(problems, fmt.Sprintf("group %d: %s has %q, %s has no such group", i+1, wantName, w[i], gotName))
		case i >= len(w):
			problems = append(problems, fmt.Sprintf("group %d: %s has %q, %s has no such group", i+1, gotName, g[i], wantName))
		case w[i] != g[i]:
			problems = append(problems, fmt.Sprintf("group %d: %s has %q, %s has %q", i+1, wantName, w[i], gotName, g[i]))
		}
	}
	return problems
}

// groupProblems returns each way groups fail to list fs's flags exactly once:
// a flag in no group or in two, a name that is no flag, a group without
// flags or without a title.
func groupProblems(fs *pflag.FlagSet, groups []flagGroup) []string {
	var problems []string
	in := map[string]string{}
	for _, g := range groups {
		if g.title == "" || len(g.flags) == 0 {
			problems = append(problems, fmt.Sprintf("group %q has no title or no flags", g.title))
		}
		for _, name := range g.flags {
			if prev, dup := in[name]; dup {
				problems = append(problems, fmt.Sprintf("--%s is in group %q and in %q", name, prev, g.title))
			}
			in[name] = g.title
			if fs.Lookup(name) == nil {
				problems = append(problems, fmt.Sprintf("group %q names --%s, which is no flag", g.title, name))
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := in[f.Name]; !ok {
			problems = append(problems, fmt.Sprintf("--%s is in no group: add it to gpuletdFlagGroups and to the README's table", f.Name))
		}
	})
	return problems
}

// gpuletdFlagSet is a FlagSet with gpuletd's flags defined.
func gpuletdFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("gpuletd", pflag.ContinueOnError)
	defineFlags(fs, &Config{}, &rawFlags{})
	return fs
}

// TestEveryFlagInOneGroup holds gpuletdFlagGroups to the flags defined: a
// flag added without a group fails here (and in the README's check).
func TestEveryFlagInOneGroup(t *testing.T) {
	for _, p := range groupProblems(gpuletdFlagSet(), gpuletdFlagGroups) {
		t.Error(p)
	}
	for name := range gpuletdComputedDefaults {
		if gpuletdFlagSet().Lookup(name) == nil {
			t.Errorf("gpuletdComputedDefaults names --%s, which is no flag", name)
		}
	}
}

// TestGroupChecksFindDisagreements feeds the group checks a flag without a
// group, groups that name a flag twice or one that does not exist, and
// listings that differ from the groups in title, flags and order, so that
// the checks above cannot pass by finding nothing.
func TestGroupChecksFindDisagreements(t *testing.T) {
	fs := gpuletdFlagSet()
	fs.Bool("brand-new", false, "a flag added without a group")
	groups := append(slices.Clone(gpuletdFlagGroups),
		flagGroup{"Twice", []string{"socket", "no-such-flag"}}, flagGroup{"Empty", nil})
	problems := strings.Join(groupProblems(fs, groups), "\n")
	for _, want := range []string{
		"--brand-new is in no group",
		`--socket is in group "Socket and state" and in "Twice"`,
		`group "Twice" names --no-such-flag, which is no flag`,
		`group "Empty" has no title or no flags`,
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("not reported: %s\nproblems:\n%s", want, problems)
		}
	}

	// --help hides no flag: the one without a group comes last, under
	// its own heading, which no README group matches.
	var help strings.Builder
	writeGroupedFlags(&help, fs, gpuletdFlagGroups, gpuletdComputedDefaults)
	_, helpGroups := readHelp(help.String())
	last := helpGroups[len(helpGroups)-1]
	if last.title != ungroupedTitle || !slices.Equal(last.flags, []string{"brand-new"}) {
		t.Errorf("last group of --help = %+v, want the flag without a group under %q", last, ungroupedTitle)
	}
	if p := compareGroups(gpuletdFlagGroups, "groups", helpGroups, "--help"); len(p) != 1 || !strings.Contains(p[0], "brand-new") {
		t.Errorf("compareGroups with an extra group in --help: %q", p)
	}

	readme := "## gpuletd\n\n| flag | default | meaning |\n| --- | --- | --- |\n" +
		"| `--socket` | x | a flag before any group |\n" +
		"| **Sockets** | | |\n" +
		"| `--run-dir` | x | |\n" +
		"| `--socket-group` | x | out of order |\n" +
		"| **GPUs** | | |\n" +
		"| `--backend` | x | |\n" +
		"| **Heading** | x | | |\n" +
		"\n## next\n"
	_, readmeGroups, bad, err := readmeFlagTable(strings.NewReader(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !strings.Contains(bad[0], "neither a group's row") {
		t.Errorf("a heading row with a cell filled: problems %q, want one", bad)
	}
	want := []flagGroup{{"Sockets", []string{"socket-group", "run-dir"}}, {"GPUs", []string{"backend", "sim-gpus"}}}
	got := compareGroups(want, "want", readmeGroups, "README")
	wantProblems := []string{
		`group 1: want has "Sockets: socket-group, run-dir", README has ": socket"`,
		`group 2: want has "GPUs: backend, sim-gpus", README has "Sockets: run-dir, socket-group"`,
		`group 3: README has "GPUs: backend", want has no such group`,
	}
	if !slices.Equal(got, wantProblems) {
		t.Errorf("compareGroups = %q\nwant %q", got, wantProblems)
	}
}
