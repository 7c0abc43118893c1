package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// goal is one speed or memory goal of docs/BENCHMARKS.md, read from the
// figure a benchmark reports.
type goal struct {
	what string
	// bench names one benchmark, without its -GOMAXPROCS suffix: a goal
	// reads one thing, never the runs of several pooled.
	bench  string
	metric string
	// floor, when not "", is the floor's own figure in the same runs,
	// shown beside the ratio so that a slow machine shows as one.
	floor string
	// atLeast: the figure must be at least bound (otherwise at most).
	atLeast bool
	// bound holds for the median of the runs; every, for each run. A goal
	// with no separate every holds in each run: a goal is met only when it
	// holds across rounds.
	bound, every float64
	// when, if set, is the condition the goal is stated under, checked on a
	// figure of the same run: the goal is judged on the runs that met it
	// alone, and not at all when none did (the benchmark could not set up
	// what the goal is stated for).
	when *condition
	// also, if set, must hold in every run too: a run where it does not
	// fails the goal (it says the figure measured something else).
	also *condition
	// context marks a row that is no goal: a figure shown under a goal to
	// say what bounds it, with neither bound nor verdict.
	context bool
}

// condition is a figure of a run that must be at least (or at most) bound
// for the run to count.
type condition struct {
	metric  string
	atLeast bool
	bound   float64
}

func (c condition) String() string {
	op := "≤ "
	if c.atLeast {
		op = "≥ "
	}
	return c.metric + " " + op + num(c.bound)
}

// negated says the condition did not hold.
func (c condition) negated() string {
	op := "> "
	if c.atLeast {
		op = "< "
	}
	return c.metric + " " + op + num(c.bound)
}

func (c condition) holds(x float64) bool {
	if c.atLeast {
		return x >= c.bound
	}
	return x <= c.bound
}

// atIngestRate is the condition of the collector's placement goal: 10,000
// snapshots arriving a second.
var atIngestRate = &condition{metric: "snapshots/s", atLeast: true, bound: 10000}

// readsAlike must hold in every run of the goals of leasing under paced
// readers: the readers of gpuletd read at least 0.95 times as often as those
// of the floor, so that both sides carried the same read load. A gpuletd
// that serves its readers fewer reads has less to do; that is no pass.
var readsAlike = &condition{metric: "x-floor-reads", atLeast: true, bound: 0.95}

// goals are the goals that benchmarks report a figure for, in the order of
// docs/BENCHMARKS.md's summary.
var goals = []goal{
	{what: "snapshot, 1 client: p50 ÷ floor-proc", bench: "BenchmarkSnapshot/clients=1/paired", metric: "x-floor-p50", floor: "floor-p50-ns", bound: 1.5},
	{what: "snapshot, 8 clients: p50 ÷ floor-proc", bench: "BenchmarkSnapshot/clients=8/paired", metric: "x-floor-p50", floor: "floor-p50-ns", bound: 1.5},
	{what: "lease+release, 1 client: ops ÷ floor-proc", bench: "BenchmarkLeaseRelease/clients=1/paired", metric: "x-floor-ops", floor: "floor-ops/s", atLeast: true, bound: 0.5},
	{what: "lease+release, 1 client: p99 ÷ floor-proc", bench: "BenchmarkLeaseRelease/clients=1/paired", metric: "x-floor-p99", floor: "floor-p99-ns", bound: 2},
	{what: "lease+release, 8 clients: ops ÷ floor-proc", bench: "BenchmarkLeaseRelease/clients=8/paired", metric: "x-floor-ops", floor: "floor-ops/s", atLeast: true, bound: 0.5},
	{what: "lease+release, 8 clients: p99 ÷ floor-proc", bench: "BenchmarkLeaseRelease/clients=8/paired", metric: "x-floor-p99", floor: "floor-p99-ns", bound: 2},
	{what: "lease+release with MPS on, 8 clients: ops ÷ floor-proc", bench: "BenchmarkLeaseReleaseMPS/clients=8/paired", metric: "x-floor-ops", floor: "floor-ops/s", atLeast: true, bound: 0.65, every: 0.55},
	{what: "… no goal: the contract's system calls alone, ops ÷ floor-proc", bench: "BenchmarkLeaseReleaseMPS/clients=8/contract-vs-floor", metric: "x-floor-ops", floor: "floor-ops/s", context: true},
	{what: "… no goal: gpuletd ÷ the contract floor", bench: "BenchmarkLeaseReleaseMPS/clients=8/paired-contract", metric: "x-contract-ops", floor: "contract-ops/s", context: true},
	{what: "leasing under 8 paced API readers: ops ÷ readers on the floor", bench: "BenchmarkLeaseUnderReaders/api/paced", metric: "x-readers-ops", floor: "floor-ops/s", atLeast: true, bound: 0.9, also: readsAlike},
	{what: "the same, 10,000 leases held", bench: "BenchmarkLeaseUnderReaders/api-held=10000/paced", metric: "x-readers-ops", floor: "floor-ops/s", atLeast: true, bound: 0.9, also: readsAlike},
	{what: "leasing under 8 paced FUSE view readers: ops ÷ readers on the floor", bench: "BenchmarkLeaseUnderReaders/view/paced", metric: "x-readers-ops", floor: "floor-ops/s", atLeast: true, bound: 0.9, also: readsAlike},
	{what: "push after a lease: p99 (ns)", bench: "BenchmarkPushLatency", metric: "p99-ns", bound: 50e6},
	{what: "pushes under lease churn (a second)", bench: "BenchmarkPushUnderChurn", metric: "pushes/s", bound: 10},
	{what: "kubelet ListAndWatch after a lease: p99 (ns)", bench: "BenchmarkKubeletListAndWatch", metric: "p99-ns", bound: 100e6},
	{what: "kubelet Allocate: p99 (ns)", bench: "BenchmarkKubeletAllocate/gpuletd", metric: "p99-ns", bound: 20e6},
	{what: "DRA: a claim's pod create → Running ÷ a plain pod's, the worst of the rounds", bench: "BenchmarkDRAPodStart", metric: "claim/plain-max", bound: 1.3},
	{what: "DRA: NodePrepareResources p99 (ms)", bench: "BenchmarkDRAPodStart", metric: "prepare-p99-ms", bound: 50},
	{what: "collector ingest (snapshots a second)", bench: "BenchmarkCollectorIngest", metric: "snapshots/s", floor: "floor-snapshots/s", atLeast: true, bound: 10000},
	{what: "collector query under ingest: p99 (ms)", bench: "BenchmarkCollectorIngest", metric: "query-p99-ms", bound: 50},
	{what: "collector placements under ingest, best-fit: p99 (µs)", bench: "BenchmarkPlacementsUnderIngest/best-fit", metric: "p99-us", bound: 5000, when: atIngestRate},
	{what: "collector placements under ingest, frag: p99 (µs)", bench: "BenchmarkPlacementsUnderIngest/frag", metric: "p99-us", bound: 5000, when: atIngestRate},
	{what: "collector placements under ingest, frag, another client flooding: p99 (µs)", bench: "BenchmarkPlacementsUnderIngest/frag-flooded", metric: "p99-us", bound: 5000, when: atIngestRate},
	{what: "the same, the flooding client past its bound, asking again when refused: p99 (µs)", bench: "BenchmarkPlacementsUnderIngest/frag-flooded-wide", metric: "p99-us", bound: 5000, when: atIngestRate},
	{what: "cluster placement, 10,000 nodes, best-fit: p99 (ns)", bench: "BenchmarkPlace10000Nodes/best-fit", metric: "p99-ns", bound: 5e6},
	{what: "cluster placement, 10,000 nodes, frag: p99 (ns)", bench: "BenchmarkPlace10000Nodes/frag", metric: "p99-ns", bound: 5e6},
	{what: "local lease under a TCP flood: p99 ÷ quiet", bench: "BenchmarkLeaseUnderTCPFlood", metric: "x-quiet-p99", floor: "floor-flood-p99-ns", bound: 2},
	{what: "offline claim counted: p99 (ns)", bench: "BenchmarkOfflineClaim/gpuletd", metric: "p99-ns", bound: 10e6},
	{what: "kill -9 → unit free: p99 (ns)", bench: "BenchmarkKillHolder/gpuletd", metric: "p99-ns", bound: 50e6},
	{what: "FUSE view read of free_units, view process: p50 ÷ go-fuse floor", bench: "BenchmarkViewRead/paired", metric: "x-floor-p50", floor: "floor-p50-ns", bound: 1.5},
	{what: "reclaim of 100 polite borrowers: ms over the grace", bench: "BenchmarkReclaim100/polite", metric: "ms-over-grace", bound: 50},
	{what: "reclaim of 100 stubborn borrowers: ms over the grace", bench: "BenchmarkReclaim100/stubborn", metric: "ms-over-grace", bound: 50},
	{what: "borrowing lease, 1 client: p50 ÷ an ordinary lease", bench: "BenchmarkBorrowLease/clients=1", metric: "x-ordinary-p50", bound: 1.1},
	{what: "borrowing lease, 4 clients: p50 ÷ an ordinary lease", bench: "BenchmarkBorrowLease/clients=4", metric: "x-ordinary-p50", bound: 1.1},
	{what: "lease+release with accounting on ÷ off", bench: "BenchmarkLeaseReleaseAccounting", metric: "x-accounting-off-ops", atLeast: true, bound: 0.95},
	{what: "resident memory, idle, gpuletd and its view process (MB)", bench: "BenchmarkMemory", metric: "idle-MB", floor: "floor-idle-MB", bound: 20},
	{what: "resident memory holding 10,240 leases, highest, both processes (MB)", bench: "BenchmarkMemory", metric: "held-peak-MB", bound: 50},
	{what: "resident memory after a restart, highest, both processes (MB)", bench: "BenchmarkMemory", metric: "restart-peak-MB", bound: 50},
	{what: "restart with 10,240 leases → serving (ms)", bench: "BenchmarkMemory", metric: "restart-ms", bound: 500},
}

// runs are the figures of every run read, by benchmark (without
// -GOMAXPROCS) and unit.
type runs map[string]map[string][]float64

// read adds the results of a file in the benchmark format to rs. Lines that
// are not results (test output, a skipped benchmark's note) are no results.
func (rs runs) read(r io.Reader, name string) error {
	br := benchfmt.NewReader(r, name)
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue
		}
		// The reader drops the Benchmark prefix; the goals name benchmarks
		// as go test prints them.
		bench := "Benchmark" + withoutProcs(res.Name.String())
		if rs[bench] == nil {
			rs[bench] = map[string][]float64{}
		}
		for _, v := range res.Values {
			// As the benchmark wrote it: the reader tidies units such as
			// p99-ns into seconds, and keeps the original beside.
			unit, x := v.OrigUnit, v.OrigValue
			if unit == "" {
				unit, x = v.Unit, v.Value
			}
			rs[bench][unit] = append(rs[bench][unit], x)
		}
	}
	return br.Err()
}

// withoutProcs is a benchmark's name without the -GOMAXPROCS suffix that
// go test adds.
func withoutProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || strings.LastIndexByte(name, '/') > i {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}

// figures are the runs of unit of benchmark bench, in the order read.
func (rs runs) figures(bench, unit string) []float64 {
	return rs[bench][unit]
}

// verdict is a goal against the runs read.
type verdict struct {
	goal
	// n counts the runs judged (for a goal with a condition, those that
	// met it) and of the runs read.
	n, of            int
	median, low, top float64
	floorMedian      float64 // median of the floor's figure; 0 when none
	// unlike counts the runs where also did not hold.
	unlike int
	met    bool
}

func judge(g goal, rs runs) verdict {
	v := verdict{goal: g}
	figs, floors := rs.figures(g.bench, g.metric), rs.figures(g.bench, g.floor)
	v.of = len(figs)
	if g.when != nil {
		// Each run's figures are read from one result line, so the
		// condition's figure of run i is the i-th; a run that lacks it
		// does not count.
		cond := rs.figures(g.bench, g.when.metric)
		var kept, keptFloors []float64
		for i, x := range figs {
			if i < len(cond) && g.when.holds(cond[i]) {
				kept = append(kept, x)
				if i < len(floors) {
					keptFloors = append(keptFloors, floors[i])
				}
			}
		}
		figs, floors = kept, keptFloors
	}
	if v.n = len(figs); v.n == 0 {
		return v
	}
	v.median, v.low, v.top = median(figs), slices.Min(figs), slices.Max(figs)
	if g.floor != "" && len(floors) > 0 {
		v.floorMedian = median(floors)
	}
	if g.also != nil {
		also := rs.figures(g.bench, g.also.metric)
		for i := range figs {
			if i >= len(also) || !g.also.holds(also[i]) {
				v.unlike++
			}
		}
	}
	every := g.every
	if every == 0 {
		every = g.bound
	}
	if g.atLeast {
		v.met = v.median >= g.bound && v.low >= every
	} else {
		v.met = v.median <= g.bound && v.top <= every
	}
	v.met = v.met && v.unlike == 0
	return v
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// write prints the verdicts as a Markdown table, the one of
// docs/BENCHMARKS.md's summary.
func write(w io.Writer, vs []verdict) {
	fmt.Fprintln(w, "| goal | benchmark | runs | median [lowest–highest] | floor (median) | goal | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, v := range vs {
		op := "≤ "
		if v.atLeast {
			op = "≥ "
		}
		want := op + num(v.bound)
		if v.every != 0 {
			want += ", every run " + op + num(v.every)
		}
		if v.when != nil {
			want += ", in runs with " + v.when.String()
		}
		if v.also != nil {
			want += ", every run with " + v.also.String()
		}
		if v.context {
			want = "—"
		}
		bench := "`" + v.bench + "` " + v.metric
		switch {
		case v.of == 0:
			fmt.Fprintf(w, "| %s | %s | 0 | not run | | %s | — |\n", v.what, bench, want)
			continue
		case v.n == 0:
			fmt.Fprintf(w, "| %s | %s | 0 of %d | not judged | | %s | not judged: no run had %s |\n", v.what, bench, v.of, want, v.when)
			continue
		}
		runs := strconv.Itoa(v.n)
		if v.when != nil {
			runs = fmt.Sprintf("%d of %d", v.n, v.of)
		}
		floor := ""
		if v.floorMedian != 0 {
			floor = num(v.floorMedian) + " " + v.floor
		}
		met := "**no**"
		switch {
		case v.context:
			met = "—"
		case v.met:
			met = "yes"
		case v.unlike > 0:
			met = fmt.Sprintf("**no**: %s in %d of %d runs", v.also.negated(), v.unlike, v.n)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s [%s–%s] | %s | %s | %s |\n", v.what, bench, runs, num(v.median), num(v.low), num(v.top), floor, want, met)
	}
}

// num prints a figure with three significant digits, as the benchmarks
// report ratios, and from 100 up as a whole number.
func num(x float64) string {
	if math.Abs(x) >= 100 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}
