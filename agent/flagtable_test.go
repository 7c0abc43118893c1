package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
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

// helpLine matches one flag line of pflag's FlagUsages: "      --name type
// usage", where a bool shows no type and may show "[=true|false]".
var helpLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?:\[=[^\]]*\])?(?: (\w+))?\s{2,}(.*)$`)

// printedDefault matches the "(default X)" pflag appends to a usage.
var printedDefault = regexp.MustCompile(` \(default (.*)\)$`)

// gpuletdHelpFlags runs gpuletd --help and reads every flag and its default
// back from pflag's listing. A usage may itself end in words such as
// "(default M×N×K)" where pflag prints nothing (the zero value stands for a
// computed default): pflag quotes a string default and prints a number,
// duration or list as its type writes it, so only a value that parses as the
// flag's type counts as a default.
func gpuletdHelpFlags(t *testing.T) map[string]helpFlag {
	t.Helper()
	var out strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out); !errors.Is(err, ErrHelp) {
		t.Fatalf("ParseFlags(--help): err = %v, want ErrHelp", err)
	}
	flags := map[string]helpFlag{}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
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
	}
	if len(flags) == 0 {
		t.Fatalf("no flag read from --help:\n%s", out.String())
	}
	return flags
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

// readmeFlagTable reads the flag table of the README's "## gpuletd" section:
// the rows after the header "| flag | default | meaning |" up to the first
// line that is not a table row. It returns the rows by flag name, and each
// row that is not a flag's or names a flag a second time.
func readmeFlagTable(readme io.Reader) (map[string]readmeRow, []string, error) {
	rows := map[string]readmeRow{}
	var bad []string
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
		case table && strings.HasPrefix(line, "| "):
			cells := strings.SplitN(strings.TrimPrefix(line, "| "), " | ", 3)
			name, ok := strings.CutPrefix(strings.Trim(cells[0], "`"), "--")
			if len(cells) < 3 || !ok || !strings.HasPrefix(cells[0], "`") {
				bad = append(bad, fmt.Sprintf("README line %d: not a flag row (| `--flag` | default | meaning |): %s", n, line))
				continue
			}
			if prev, dup := rows[name]; dup {
				bad = append(bad, fmt.Sprintf("README line %d: --%s is in the table already (line %d)", n, name, prev.line))
			}
			rows[name] = readmeRow{line: n, def: cells[1]}
		case table:
			table = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, errors.New("no gpuletd flag table (a \"| flag | default | meaning |\" table under \"## gpuletd\")")
	}
	return rows, bad, nil
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
	rows, problems, err := readmeFlagTable(readme)
	if err != nil {
		t.Fatalf("README: %v", err)
	}
	problems = append(problems, checkFlagTable(gpuletdHelpFlags(t), rows, defaults)...)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckFlagTableFindsDisagreements feeds the check a README that
// disagrees with the flags in every way it can, so that the check above
// cannot pass by finding nothing.
func TestCheckFlagTableFindsDisagreements(t *testing.T) {
	flags := gpuletdHelpFlags(t)
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
	rows, rowProblems, err := readmeFlagTable(strings.NewReader(readme))
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
