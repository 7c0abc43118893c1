// Package flaghelp writes a command's --help with its flags under headings,
// the way the command's flag table in the docs (docs/gpuletd.md,
// docs/collector.md) groups them, and reads both back, so that a test can
// hold that table, --help and the code to one another (check.go).
package flaghelp

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Group is a heading of --help and the flags under it, in order.
type Group struct {
	Title string
	Flags []string
}

// requiredMark ends the usage of a flag that must be given.
const requiredMark = "(required)"

// UngroupedTitle heads the flags that no group names, so that --help hides
// none while a test says which group each belongs in.
const UngroupedTitle = "Other"

// Write writes fs's flags under the headings of groups, each flag with its
// default, the usages aligned in one column; computed holds, by flag name,
// the words of the defaults worked out at start, which the flag's own zero
// value stands for. A flag no group names comes last, under UngroupedTitle;
// a name no flag has is passed over.
func Write(out io.Writer, fs *pflag.FlagSet, groups []Group, computed map[string]string) {
	grouped := map[string]bool{}
	var sections []flagSection
	for _, g := range groups {
		s := flagSection{title: g.Title}
		for _, name := range g.Flags {
			if f := fs.Lookup(name); f != nil {
				s.flags = append(s.flags, f)
			}
			grouped[name] = true
		}
		sections = append(sections, s)
	}
	other := flagSection{title: UngroupedTitle}
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
			if strings.HasSuffix(usage, requiredMark) {
				// A flag that must be given has no default to show.
				fmt.Fprintf(out, "%-*s  %s\n", width, flagSynopsis(f), usage)
				continue
			}
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
