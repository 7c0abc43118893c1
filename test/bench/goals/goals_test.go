package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func readSample(t *testing.T) runs {
	t.Helper()
	f, err := os.Open("testdata/sample.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs := runs{}
	if err := rs.read(f, "sample.txt"); err != nil {
		t.Fatal(err)
	}
	return rs
}

func goalOf(t *testing.T, bench, metric string) goal {
	t.Helper()
	for _, g := range goals {
		if g.bench == bench && g.metric == metric {
			return g
		}
	}
	t.Fatalf("no goal for %s %s", bench, metric)
	return goal{}
}

// Each goal is judged on every run read: the median against its bound, and
// each run against the per-run bound (the bound itself unless the goal
// names another), so that one bad round fails a goal whose median meets
// it. Units are read as the benchmark wrote them (p99-ns stays in ns), and
// the GOMAXPROCS suffix is no part of a name. A goal with a condition is
// judged on the runs that met it, and not at all when none did; a goal whose
// runs must also show a second figure fails in a run that does not.
func TestJudge(t *testing.T) {
	rs := readSample(t)
	for _, c := range []struct {
		bench, metric string
		n             int
		median, floor float64
		met           bool
	}{
		// Median 0.6611 ≥ 0.65 but one run at 0.5126 < 0.55.
		{"BenchmarkLeaseReleaseMPS/clients=8/paired", "x-floor-ops", 3, 0.6611, 13517, false},
		// Median 19.34 ≤ 20 and both runs.
		{"BenchmarkMemory", "idle-MB", 2, 19.34, 13.41, true},
		// Median 442 ≤ 500, but one run took 566 ms.
		{"BenchmarkMemory", "restart-ms", 2, 442, 0, false},
		// Two runs read, one at 10,000 snapshots/s, and judged on it.
		{"BenchmarkPlacementsUnderIngest/frag", "p99-us", 1, 6100, 0, false},
		// Below the ingest rate in its only run: not judged.
		{"BenchmarkPlacementsUnderIngest/best-fit", "p99-us", 0, 0, 0, false},
		// Paced readers, both sides read alike in both runs.
		{"BenchmarkLeaseUnderReaders/api/paced", "x-readers-ops", 2, 0.95, 3000, true},
		// Median 1 ≥ 0.9, but one run's readers of gpuletd read 0.75× as
		// often as the floor's: a slow read path raised its ratio.
		{"BenchmarkLeaseUnderReaders/api-held=10000/paced", "x-readers-ops", 2, 1, 3000, false},
		{"BenchmarkPushLatency", "p99-ns", 1, 3100000, 0, true},
		// Skipped: no run, so neither met nor failed.
		{"BenchmarkLeaseUnderReaders/view/paced", "x-readers-ops", 0, 0, 0, false},
	} {
		v := judge(goalOf(t, c.bench, c.metric), rs)
		if v.n != c.n || !near(v.median, c.median) || !near(v.floorMedian, c.floor) || v.met != c.met {
			t.Errorf("%s %s: %d runs, median %v, floor %v, met %v; want %d, %v, %v, %v", c.bench, c.metric, v.n, v.median, v.floorMedian, v.met, c.n, c.median, c.floor, c.met)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestWithoutProcs(t *testing.T) {
	for in, want := range map[string]string{
		"BenchmarkMemory-2":                     "BenchmarkMemory",
		"BenchmarkSnapshot/clients=8/paired-16": "BenchmarkSnapshot/clients=8/paired",
		"BenchmarkMemory":                       "BenchmarkMemory",
		"BenchmarkPlace/held=10000-x":           "BenchmarkPlace/held=10000-x",
		"BenchmarkA-b/c":                        "BenchmarkA-b/c",
	} {
		if got := withoutProcs(in); got != want {
			t.Errorf("withoutProcs(%q) = %q, want %q", in, got, want)
		}
	}
}

// The table has a row per goal, says which did not run, and marks the
// goals not met.
func TestTable(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"testdata/sample.txt"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2+len(goals) {
		t.Fatalf("%d lines for %d goals:\n%s", len(lines), len(goals), out.String())
	}
	for _, want := range []string{
		"| lease+release with MPS on, 8 clients: ops ÷ floor-proc | `BenchmarkLeaseReleaseMPS/clients=8/paired` x-floor-ops | 3 | 0.661 [0.513–0.727] | 13517 floor-ops/s | ≥ 0.65, every run ≥ 0.55 | **no** |",
		"| resident memory, idle, gpuletd and its view process (MB) | `BenchmarkMemory` idle-MB | 2 | 19.3 [19.3–19.4] | 13.4 floor-idle-MB | ≤ 20 | yes |",
		"| leasing under 8 paced FUSE view readers: ops ÷ readers on the floor | `BenchmarkLeaseUnderReaders/view/paced` x-readers-ops | 0 | not run | | ≥ 0.9, every run with x-floor-reads ≥ 0.95 | — |",
		"| the same, 10,000 leases held | `BenchmarkLeaseUnderReaders/api-held=10000/paced` x-readers-ops | 2 | 1 [0.95–1.05] | 3000 floor-ops/s | ≥ 0.9, every run with x-floor-reads ≥ 0.95 | **no**: x-floor-reads < 0.95 in 1 of 2 runs |",
		"| collector placements under ingest, frag: p99 (µs) | `BenchmarkPlacementsUnderIngest/frag` p99-us | 1 of 2 | 6100 [6100–6100] |  | ≤ 5000, in runs with snapshots/s ≥ 10000 | **no** |",
		"| collector placements under ingest, best-fit: p99 (µs) | `BenchmarkPlacementsUnderIngest/best-fit` p99-us | 0 of 1 | not judged | | ≤ 5000, in runs with snapshots/s ≥ 10000 | not judged: no run had snapshots/s ≥ 10000 |",
		// A row that is no goal has its figure and floor, and neither
		// bound nor verdict.
		"| … no goal: gpuletd ÷ the contract floor | `BenchmarkLeaseReleaseMPS/clients=8/paired-contract` x-contract-ops | 2 | 0.64 [0.61–0.67] | 8550 contract-ops/s | — | — |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks\n%s\n%s", want, out.String())
		}
	}
}

// Each goal reads one benchmark, and a unit in its label is its metric's.
func TestGoalsReadOneThing(t *testing.T) {
	units := map[string]string{"(ns)": "-ns", "(ms)": "-ms", "(µs)": "-us", "(MB)": "-MB", "(a second)": "/s", "(snapshots a second)": "snapshots/s"}
	for _, g := range goals {
		if strings.ContainsAny(g.bench, "*?[") {
			t.Errorf("%s: %q pools several benchmarks", g.what, g.bench)
		}
		i := strings.LastIndexByte(g.what, '(')
		if i < 0 || !strings.HasSuffix(g.what, ")") {
			continue
		}
		suffix, ok := units[g.what[i:]]
		if !ok {
			t.Errorf("%s: unit %s unknown to this test", g.what, g.what[i:])
		} else if !strings.HasSuffix(g.metric, suffix) {
			t.Errorf("%s: labelled %s, its metric %s", g.what, g.what[i:], g.metric)
		}
	}
}

func TestNoResults(t *testing.T) {
	err := run([]string{"-"}, strings.NewReader("PASS\nok  \tgithub.com/gpulet/gpulet/x\t0.1s\n"), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no benchmark results") {
		t.Fatalf("input without results: %v", err)
	}
}

// FuzzRead: whatever the input, reading and judging it never panic, and
// every figure read belongs to a benchmark named as go test names them.
func FuzzRead(f *testing.F) {
	sample, err := os.ReadFile("testdata/sample.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sample)
	f.Add([]byte("BenchmarkX-2 1 2 ns/op 3 x-floor-ops\n"))
	f.Add([]byte("BenchmarkX 1 NaN y\nBenchmark-1 0\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rs := runs{}
		rs.read(bytes.NewReader(in), "fuzz")
		for name := range rs {
			if !strings.HasPrefix(name, "Benchmark") {
				t.Fatalf("%q is no benchmark's name", name)
			}
		}
		vs := make([]verdict, len(goals))
		for i, g := range goals {
			vs[i] = judge(g, rs)
		}
		write(&bytes.Buffer{}, vs)
	})
}
