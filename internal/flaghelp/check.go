package flaghelp

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// What tests read back: a command's --help and the docs' table of its
// flags, each as groups of flags with their defaults, and the ways the two
// and the code's groups disagree.

// Flag is one flag as --help lists it.
type Flag struct {
	Kind string // pflag's type word: string, int, duration, stringArray; "bool" for a bool
	// Def is the default pflag prints, unquoted; empty where pflag prints
	// none, which it does for a zero value (false, 0, "", no elements).
	Def string
}

// helpLine matches one flag line of --help: "  --name type  usage (default
// D)", where a bool shows no type. pflag's own listing would match too.
var helpLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?:\[=[^\]]*\])?(?: (\w+))?\s{2,}(.*)$`)

// printedDefault matches the "(default X)" --help appends to a usage.
var printedDefault = regexp.MustCompile(` \(default (.*)\)$`)

// helpHeading matches a group's heading in --help: "Title:" at the start of
// a line.
var helpHeading = regexp.MustCompile(`^(\S.*):$`)

// ReadHelp reads --help's text: every flag and its default, and the groups,
// each heading with the flags under it, in order; a flag before any heading
// is in a group titled "". A usage may itself end in words such as
// "(default M×N×K)" where the printed default is a word (the zero value
// stands for a computed default): a string default is quoted and a number,
// duration or list is written as its type writes it, so only a value that
// parses as the flag's type counts as a default.
func ReadHelp(help string) (map[string]Flag, []Group) {
	flags := map[string]Flag{}
	var groups []Group
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		if h := helpHeading.FindStringSubmatch(sc.Text()); h != nil {
			groups = append(groups, Group{Title: h[1]})
			continue
		}
		m := helpLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := Flag{Kind: m[2]}
		if f.Kind == "" {
			f.Kind = "bool"
		}
		if d := printedDefault.FindStringSubmatch(m[3]); d != nil {
			f.Def = typedDefault(f.Kind, d[1])
		}
		flags[m[1]] = f
		if len(groups) == 0 {
			groups = append(groups, Group{})
		}
		g := &groups[len(groups)-1]
		g.Flags = append(g.Flags, m[1])
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

// Row is one row of a flag table in the docs.
type Row struct {
	Line int
	Def  string // the default cell as written
}

// tableGroupRow matches a row of a flag table that heads a group:
// "| **Title** | | |".
var tableGroupRow = regexp.MustCompile(`^\| \*\*([^*]+)\*\* \| +\| +\|$`)

// DocTable reads the flag table of a Markdown page's section headed
// section ("## Flags" of docs/gpuletd.md): the rows after the header
// "| flag | default | meaning |" up to the first line that is not a table
// row. It returns the rows by flag name, the groups (each heading row with
// the flag rows under it, in order; a flag row before any heading row is in a
// group titled ""), and each row that is neither a heading's nor a flag's or
// names a flag a second time.
func DocTable(page io.Reader, section string) (map[string]Row, []Group, []string, error) {
	rows := map[string]Row{}
	var (
		groups []Group
		bad    []string
	)
	sc := bufio.NewScanner(page)
	in, table := false, false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == section
			table = false
		case in && line == "| flag | default | meaning |":
			table = true
		case table && strings.HasPrefix(line, "| --- "):
		case table && tableGroupRow.MatchString(line):
			groups = append(groups, Group{Title: tableGroupRow.FindStringSubmatch(line)[1]})
		case table && strings.HasPrefix(line, "| "):
			cells := strings.SplitN(strings.TrimPrefix(line, "| "), " | ", 3)
			name, ok := strings.CutPrefix(strings.Trim(cells[0], "`"), "--")
			if len(cells) < 3 || !ok || !strings.HasPrefix(cells[0], "`") {
				bad = append(bad, fmt.Sprintf("flag table line %d: neither a group's row (| **Title** | | |) nor a flag's (| `--flag` | default | meaning |): %s", n, line))
				continue
			}
			if prev, dup := rows[name]; dup {
				bad = append(bad, fmt.Sprintf("flag table line %d: --%s is in the table already (line %d)", n, name, prev.Line))
			}
			rows[name] = Row{Line: n, Def: cells[1]}
			if len(groups) == 0 {
				groups = append(groups, Group{})
			}
			g := &groups[len(groups)-1]
			g.Flags = append(g.Flags, name)
		case table:
			table = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil, fmt.Errorf("no flag table (a \"| flag | default | meaning |\" table under %q)", section)
	}
	return rows, groups, bad, nil
}

// CheckTable returns each disagreement between the flags of command that
// --help lists and the flag table's rows. A default the table writes as a
// value is the flag's in backquotes, "off" for a bool that is off, "none" for
// an empty string or list; computed holds, by flag name, the table's words
// for a default worked out at start, which the caller checks.
func CheckTable(command string, flags map[string]Flag, rows map[string]Row, computed map[string]string) []string {
	var bad []string
	for name := range flags {
		if _, ok := rows[name]; !ok {
			bad = append(bad, fmt.Sprintf("--%s is a %s flag but has no row in the flag table", name, command))
		}
	}
	for name, row := range rows {
		f, ok := flags[name]
		if !ok {
			bad = append(bad, fmt.Sprintf("flag table line %d: --%s is no %s flag", row.Line, name, command))
			continue
		}
		if words, ok := computed[name]; ok {
			if row.Def != words {
				bad = append(bad, fmt.Sprintf("flag table line %d: --%s default %s, want %s (computed at start)", row.Line, name, row.Def, words))
			}
			continue
		}
		var want string
		switch {
		case f.Def != "":
			want = "`" + f.Def + "`"
		case f.Kind == "bool":
			want = "off"
		case f.Kind == "string" || f.Kind == "stringArray":
			want = "none"
		default:
			want = "`" + "0" + "`"
		}
		if row.Def != want {
			bad = append(bad, fmt.Sprintf("flag table line %d: --%s default %s, but the flag's is %s", row.Line, name, row.Def, want))
		}
	}
	sort.Strings(bad)
	return bad
}

// groupLines writes groups one a line, "Title: flag, flag", for comparing.
func groupLines(groups []Group) []string {
	lines := make([]string, len(groups))
	for i, g := range groups {
		lines[i] = g.Title + ": " + strings.Join(g.Flags, ", ")
	}
	return lines
}

// CompareGroups returns each group in which got differs from want: its title,
// its flags or their order, and each group one has and the other lacks.
func CompareGroups(want []Group, wantName string, got []Group, gotName string) []string {
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

// GroupProblems returns each way groups (named groupsName in the code) fail
// to list fs's flags exactly once: a flag in no group or in two, a name that
// is no flag, a group without flags or without a title.
func GroupProblems(fs *pflag.FlagSet, groups []Group, groupsName string) []string {
	var problems []string
	in := map[string]string{}
	for _, g := range groups {
		if g.Title == "" || len(g.Flags) == 0 {
			problems = append(problems, fmt.Sprintf("group %q has no title or no flags", g.Title))
		}
		for _, name := range g.Flags {
			if prev, dup := in[name]; dup {
				problems = append(problems, fmt.Sprintf("--%s is in group %q and in %q", name, prev, g.Title))
			}
			in[name] = g.Title
			if fs.Lookup(name) == nil {
				problems = append(problems, fmt.Sprintf("group %q names --%s, which is no flag", g.Title, name))
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := in[f.Name]; !ok {
			problems = append(problems, fmt.Sprintf("--%s is in no group: add it to %s and to the flag table in the docs", f.Name, groupsName))
		}
	})
	return problems
}

// ShapeProblems returns each way help fails the shape Write gives it: a flag
// line without a default (a required flag has none), a usage outside the column of the first one, and
// a count of flag lines other than one for each of fs's flags.
func ShapeProblems(help string, fs *pflag.FlagSet) []string {
	var problems []string
	column, lines := -1, 0
	for line := range strings.SplitSeq(help, "\n") {
		m := helpLine.FindStringSubmatchIndex(line)
		if m == nil {
			continue
		}
		lines++
		if !printedDefault.MatchString(line) && !strings.HasSuffix(line, requiredMark) {
			problems = append(problems, fmt.Sprintf("no default on %q", line))
		}
		if column == -1 {
			column = m[6]
		}
		if m[6] != column {
			problems = append(problems, fmt.Sprintf("usage at column %d, not %d: %q", m[6], column, line))
		}
	}
	n := 0
	fs.VisitAll(func(*pflag.Flag) { n++ })
	if lines != n {
		problems = append(problems, fmt.Sprintf("%d flag lines, want one a flag (%d)", lines, n))
	}
	return problems
}
