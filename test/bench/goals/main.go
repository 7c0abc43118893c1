// Command goals reads the output of the project's benchmarks (go test
// -bench, as make bench writes it) and prints each goal of
// docs/BENCHMARKS.md that a benchmark reports a figure for: the median of
// the runs read and their range, the floor's own figure where there is one,
// the goal, and whether it is met, which needs every run to meet it (for the
// goal with a median bound and a per-run bound, both). A goal whose
// benchmark did not run (it skipped itself, or was not asked for) says so.
//
//	go run ./test/bench/goals FILE...   # - reads standard input
//
// It exits 1 when a file cannot be read; goals not met are the table's
// to show, not an error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./test/bench/goals FILE... (- for standard input)\n\nprints the goals of docs/BENCHMARKS.md against the go test -bench output in FILE, as a Markdown table")
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Args(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "goals:", err)
		os.Exit(1)
	}
}

// run reads every file (stdin for -) and writes the table to out.
func run(files []string, stdin io.Reader, out io.Writer) error {
	rs := runs{}
	for _, name := range files {
		if name == "-" {
			if err := rs.read(stdin, "stdin"); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = rs.read(f, name)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if len(rs) == 0 {
		return errors.New("no benchmark results in the input")
	}
	vs := make([]verdict, len(goals))
	for i, g := range goals {
		vs[i] = judge(g, rs)
	}
	write(out, vs)
	return nil
}
