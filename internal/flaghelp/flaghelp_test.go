package flaghelp

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// testFlags are flags of each kind --help writes, in the groups testGroups
// puts them under.
func testFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
	fs.String("socket", "/run/gpulet/gpulet.sock", "API socket")
	fs.String("socket-group", "gpulet", "group that owns the socket")
	fs.String("run-dir", "/run/gpulet", "state that survives a restart")
	fs.String("mount", "", "FUSE view mount point (\"\" for none)")
	fs.String("backend", "auto", "GPU backend")
	fs.String("sim-gpus", "2xA100-80GB", "simulated GPUs")
	fs.Int("max-utilization", 90, "percent of a GPU's SMs in use")
	fs.Duration("sample-interval", time.Second, "how often GPUs are sampled")
	fs.Int("units-per-gpu", 0, "U: units per GPU (default M×N×K)")
	fs.Bool("kubelet-plugin", false, "serve the kubelet's device-plugin API")
	fs.StringArray("upstream", nil, "URL that receives the snapshots")
	fs.String("node-name", "", "the node's name")
	fs.String("admin-group", "", "group of admins")
	return fs
}

var testGroups = []Group{
	{Title: "Socket and state", Flags: []string{"socket", "socket-group", "run-dir", "mount"}},
	{Title: "GPUs", Flags: []string{"backend", "sim-gpus"}},
	{Title: "Placement and sampling", Flags: []string{"max-utilization", "sample-interval", "units-per-gpu"}},
	{Title: "Node", Flags: []string{"kubelet-plugin", "upstream", "node-name", "admin-group"}},
}

// testComputed are testFlags' defaults worked out at start, in --help's words.
var testComputed = map[string]string{"mount": "<run-dir>/view", "units-per-gpu": "16", "node-name": "host name"}

func testHelp(fs *pflag.FlagSet, groups []Group) string {
	var help strings.Builder
	Write(&help, fs, groups, testComputed)
	return help.String()
}

// What Write writes, ReadHelp reads back: the groups in order, each flag's
// type and its default where pflag would write one, a computed default's
// words taken for prose.
func TestWriteReadsBack(t *testing.T) {
	help := testHelp(testFlags(), testGroups)
	flags, groups := ReadHelp(help)
	if p := CompareGroups(testGroups, "testGroups", groups, "--help"); len(p) > 0 {
		t.Errorf("groups read back: %q\n%s", p, help)
	}
	for name, want := range map[string]Flag{
		"socket": {"string", "/run/gpulet/gpulet.sock"}, "max-utilization": {"int", "90"}, "sample-interval": {"duration", "1s"},
		"kubelet-plugin": {"bool", ""}, "upstream": {"stringArray", ""}, "admin-group": {"string", ""},
		"mount": {"string", ""}, "units-per-gpu": {"int", ""}, "node-name": {"string", ""},
	} {
		if got := flags[name]; got != want {
			t.Errorf("--%s read back as %+v, want %+v", name, got, want)
		}
	}
	for _, line := range []string{"(default none)", "(default <run-dir>/view)", "(default host name)", `(default "auto")`} {
		if !strings.Contains(help, line) {
			t.Errorf("--help lacks %q:\n%s", line, help)
		}
	}
	if p := ShapeProblems(help, testFlags()); len(p) > 0 {
		t.Errorf("shape: %q\n%s", p, help)
	}
	if p := ShapeProblems(strings.Replace(help, "  --socket string ", "  --socket string", 1), testFlags()); len(p) == 0 {
		t.Error("a usage out of its column was not reported")
	}
}

// CheckTable is fed a flag table that disagrees with the flags in every way it
// can, so that a check built on it cannot pass by finding nothing.
func TestCheckTableFindsDisagreements(t *testing.T) {
	flags, _ := ReadHelp(testHelp(testFlags(), testGroups))
	page := "## cmd\n\n| flag | default | meaning |\n| --- | --- | --- |\n" +
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
	rows, _, rowProblems, err := DocTable(strings.NewReader(page), "## cmd")
	if err != nil {
		t.Fatal(err)
	}
	words := map[string]string{"mount": "`<run-dir>/view`", "node-name": "host name"}
	problems := strings.Join(append(rowProblems, CheckTable("cmd", flags, rows, words)...), "\n")
	var missed []string
	for _, want := range []string{
		"--socket default `/run/gpulet/other.sock`",
		"--sample-interval default `2s`",
		"--kubelet-plugin default on",
		"--upstream default `http://x`",
		"--mount default `/run/gpulet/view`",
		"--no-such-flag is no cmd flag",
		"--backend is a cmd flag but has no row",
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
	if _, _, _, err := DocTable(strings.NewReader(page), "## other"); err == nil {
		t.Error("a section without a table was read")
	}
}

// The group checks are fed a flag without a group, groups that name a flag
// twice or one that does not exist, and listings that differ from the
// groups in title, flags and order, so that checks built on them cannot pass
// by finding nothing.
func TestGroupChecksFindDisagreements(t *testing.T) {
	fs := testFlags()
	fs.Bool("brand-new", false, "a flag added without a group")
	groups := append(slices.Clone(testGroups),
		Group{"Twice", []string{"socket", "no-such-flag"}}, Group{"Empty", nil})
	problems := strings.Join(GroupProblems(fs, groups, "testGroups"), "\n")
	for _, want := range []string{
		"--brand-new is in no group: add it to testGroups",
		`--socket is in group "Socket and state" and in "Twice"`,
		`group "Twice" names --no-such-flag, which is no flag`,
		`group "Empty" has no title or no flags`,
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("not reported: %s\nproblems:\n%s", want, problems)
		}
	}

	// --help hides no flag: the one without a group comes last, under
	// its own heading, which no group of the table matches.
	_, helpGroups := ReadHelp(testHelp(fs, testGroups))
	last := helpGroups[len(helpGroups)-1]
	if last.Title != UngroupedTitle || !slices.Equal(last.Flags, []string{"brand-new"}) {
		t.Errorf("last group of --help = %+v, want the flag without a group under %q", last, UngroupedTitle)
	}
	if p := CompareGroups(testGroups, "groups", helpGroups, "--help"); len(p) != 1 || !strings.Contains(p[0], "brand-new") {
		t.Errorf("CompareGroups with an extra group in --help: %q", p)
	}

	page := "## cmd\n\n| flag | default | meaning |\n| --- | --- | --- |\n" +
		"| `--socket` | x | a flag before any group |\n" +
		"| **Sockets** | | |\n" +
		"| `--run-dir` | x | |\n" +
		"| `--socket-group` | x | out of order |\n" +
		"| **GPUs** | | |\n" +
		"| `--backend` | x | |\n" +
		"| **Heading** | x | | |\n" +
		"\n## next\n"
	_, docGroups, bad, err := DocTable(strings.NewReader(page), "## cmd")
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !strings.Contains(bad[0], "neither a group's row") {
		t.Errorf("a heading row with a cell filled: problems %q, want one", bad)
	}
	want := []Group{{"Sockets", []string{"socket-group", "run-dir"}}, {"GPUs", []string{"backend", "sim-gpus"}}}
	got := CompareGroups(want, "want", docGroups, "README")
	wantProblems := []string{
		`group 1: want has "Sockets: socket-group, run-dir", README has ": socket"`,
		`group 2: want has "GPUs: backend, sim-gpus", README has "Sockets: run-dir, socket-group"`,
		`group 3: README has "GPUs: backend", want has no such group`,
	}
	if !slices.Equal(got, wantProblems) {
		t.Errorf("CompareGroups = %q\nwant %q", got, wantProblems)
	}
}
