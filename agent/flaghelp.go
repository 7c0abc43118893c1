package agent

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/pflag"
)

// flagGroup is a heading of --help and the flags under it, in order.
type flagGroup struct {
	title string
	flags []string
}

// gpuletdFlagGroups are gpuletd's flags as --help and the README's flag table
// list them: the same headings, the same flags under each, in the same order
// (flagtable_test.go holds all three to one another).
var gpuletdFlagGroups = []flagGroup{
	{"Socket and state", []string{"socket", "socket-group", "run-dir", "state-dir", "mount"}},
	{"GPUs", []string{"backend", "sim-gpus"}},
	{"Units (M×N×K, U)", []string{"units-per-client", "clients-per-instance", "instances-per-gpu", "units-per-gpu"}},
	{"Placement and sampling", []string{"max-utilization", "policy", "sample-interval", "accounting"}},
	{"Node, admins and config", []string{"node-name", "admin-group", "config"}},
	{"Pushing to upstreams", []string{"upstream", "report-interval", "upstream-token-file", "upstream-cert", "upstream-key", "upstream-ca"}},
	{"Read-only TCP endpoint", []string{"listen", "listen-full-detail", "listen-max-conns", "listen-max-conns-per-addr"}},
	{"Limits per uid", []string{"max-conns-per-uid", "max-waiters-per-uid"}},
	{"MPS", []string{"mps", "mps-control"}},
	{"Reservations", []string{"reclaim-grace"}},
	{"Kubernetes", []string{"kubelet-plugin", "kubelet-dir", "pod-resources-socket", "pod-resources-interval"}},
}

// gpuletdComputedDefaults are the defaults worked out at start, which the
// flag's own zero value stands for: --help shows them in words.
var gpuletdComputedDefaults = map[string]string{
	"mount":            "<run-dir>/view",
	"units-per-client": "U",
	"units-per-gpu":    "16",
}

// ungroupedTitle heads the flags that no group names, so that --help hides
// none while a test says which group each belongs in.
const ungroupedTitle = "Other"

// writeGroupedFlags writes fs's flags under the headings of groups, each flag
// with its default, the usages aligned in one column. A flag no group names
// comes last, under ungroupedTitle; a name no flag has is passed over.
func writeGroupedFlags(out io.Writer, fs *pflag.FlagSet, groups []flagGroup, computed map[string]string) {
	grouped := map[string]bool{}
	var sections []flagSection
	for _, g := range groups {
		s := flagSection{title: g.title}
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil {
				s.flags = append(s.flags, f)
			}
			grouped[name] = true
		}
		sections = append(sections, s)
	}
	other := flagSection{title: ungroupedTitle}
	fs.VisitAll(func(f *pflag.Flag) {
		if !grouped[f.Name] {
			other.flags = append(other.flags, f)
		}
	})
	if len(other.flags) > 0 {
		sections = append(sections, other)
	}
	width := 0
	for _, s := range sections {
		for _, f := range s.flags {
			width = max(width, len(flagSynopsis(f)))
		}
	}
	for i, s := range sections {
		if i > 0 {
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "%s:\n", s.title)
		for _, f := range s.flags {
			_, usage := pflag.UnquoteUsage(f)
			fmt.Fprintf(out, "%-*s  %s (default %s)\n", width, flagSynopsis(f), usage, shownDefault(f, computed))
		}
	}
}

// flagSection is a heading of --help and its flags, looked up.
type flagSection struct {
	title string
	flags []*pflag.Flag
}

// flagSynopsis is the left column of a flag's line: "  --name type" as
// pflag writes it, no type for a bool.
func flagSynopsis(f *pflag.Flag) string {
	s := "  --" + f.Name
	if kind, _ := pflag.UnquoteUsage(f); kind != "" {
		s += " " + kind
	}
	return s
}

// shownDefault is the default --help gives a flag: the words of a computed
// one, a string quoted ("none" where it is empty), an empty list as "none",
// anything else as pflag writes it.
func shownDefault(f *pflag.Flag, computed map[string]string) string {
	if words, ok := computed[f.Name]; ok {
		return words
	}
	switch f.Value.Type() {
	case "string":
		if f.DefValue == "" {
			return "none"
		}
		return strconv.Quote(f.DefValue)
	case "stringArray", "stringSlice":
		if f.DefValue == "[]" {
			return "none"
		}
	}
	return f.DefValue
}
