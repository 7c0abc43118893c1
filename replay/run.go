package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/placement"
)

// options are gpulet-replay's flags.
type options struct {
	nodes, pods string
	policies    []string
	seeds       []uint64
	tune        float64
	fileOrder   bool
	csv, plot   string
}

const usage = `Usage: gpulet-replay --nodes FILE --pods FILE [--policy P[,P...]] [--seeds 42-51] [--tune 1.3] [--file-order] [--csv FILE] [--plot FILE.svg]

Replays a node list and a pod list (the CSV files of Alibaba's openb trace) in the
protocol of the FGD paper's artifact: for each seed, the pods shuffled with Go's
seeded math/rand and tuned to --tune times the cluster's GPU capacity, placed one
at a time and never leaving, through gpulet's cluster placement over node models in
memory, or through one of the paper's own policies (paper-*, replay only). Prints,
per policy, the mean over the seeds of the paper's figure, the GPU allocated at
100% and 130% of the capacity arrived:

  POLICY alloc@100=95.31% alloc@130=95.60% failed=123 seeds=10 time=12.3s

(failed: pods no node could take, mean over the seeds; time: per seed). The
decision time of the cluster placement (p50, p99, over every pod of every seed)
and a progress line go to stderr.
`

// parse reads gpulet-replay's flags; --help goes to stdout, as asked for.
func parse(args []string, stdout io.Writer) (options, error) {
	fs := pflag.NewFlagSet("gpulet-replay", pflag.ContinueOnError)
	fs.SetOutput(stdout)
	var o options
	var policies, seeds string
	fs.StringVar(&o.nodes, "nodes", "", "node list CSV: sn,cpu_milli,memory_mib,gpu,model (required)")
	fs.StringVar(&o.pods, "pods", "", "pod list CSV: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec] (required)")
	fs.StringVar(&policies, "policy", "first-fit,best-fit,spread,score,frag", "placement policies, comma-separated: gpulet's ("+policyNames(placement.Policies)+") or the paper's ("+strings.Join(PaperPolicies, ", ")+")")
	fs.StringVar(&seeds, "seeds", "42-51", "seeds of the shuffle and the tuning draws: N, N-M, or a comma-separated list of them")
	fs.Float64Var(&o.tune, "tune", 1.3, "workload as a multiple of the cluster's GPU capacity")
	fs.BoolVar(&o.fileOrder, "file-order", false, "place the pods in the pod list's order, not shuffled: not the paper's protocol")
	fs.StringVar(&o.csv, "csv", "", "write the curves here: policy,seed,arrived_pct,alloc_pct,failed_pods,frag_milli_gpu")
	fs.StringVar(&o.plot, "plot", "", "draw the mean curves, with the published figures, as SVG here")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.nodes == "" || o.pods == "" {
		return o, errors.New("--nodes and --pods are required")
	}
	if !(o.tune > 0 && o.tune <= 10) {
		return o, fmt.Errorf("--tune %v: want a number above 0, at most 10", o.tune)
	}
	for _, s := range strings.Split(policies, ",") {
		p := strings.TrimSpace(s)
		if _, err := placement.ParsePolicy(p); err != nil && !slices.Contains(PaperPolicies, p) {
			return o, fmt.Errorf("--policy %q: must be one of %s, %s", p, policyNames(placement.Policies), strings.Join(PaperPolicies, ", "))
		}
		if slices.Contains(o.policies, p) {
			return o, fmt.Errorf("--policy: %s twice", p)
		}
		o.policies = append(o.policies, p)
	}
	var err error
	if o.seeds, err = parseSeeds(seeds); err != nil {
		return o, err
	}
	return o, nil
}

func policyNames(ps []placement.Policy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// maxSeeds bounds --seeds: each seed is a whole replay.
const maxSeeds = 1000

// parseSeeds reads "42-51", "7" or "1,3,5-6".
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseUint(hi, 10, 64)
		}
		if err != nil || b < a || b-a >= maxSeeds || len(out)+int(b-a+1) > maxSeeds {
			return nil, fmt.Errorf("--seeds %q: want N, N-M with N ≤ M, or a list of them, %d seeds at most", s, maxSeeds)
		}
		for v := a; ; v++ {
			out = append(out, v)
			if v == b {
				break
			}
		}
	}
	return out, nil
}

// Run is gpulet-replay: it returns the exit status (0, 1 when the replay
// failed, 2 for bad usage).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stdout)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpulet-replay:", err)
		return 2
	}
	if err := run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "gpulet-replay:", err)
		return 1
	}
	return 0
}

func readFile[T any](path string, read func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func run(ctx context.Context, o options, stdout, stderr io.Writer) error {
	nodes, err := readFile(o.nodes, ReadNodes)
	if err != nil {
		return fmt.Errorf("--nodes: %w", err)
	}
	pods, err := readFile(o.pods, ReadPods)
	if err != nil {
		return fmt.Errorf("--pods: %w", err)
	}
	progress := progressLine(stderr)
	var results [][]Result // per policy, per seed
	for _, p := range o.policies {
		var per []Result
		for _, seed := range o.seeds {
			// Made again for each policy: it costs little next to a
			// replay, and up to 1,000 seeds' workloads are not kept.
			w := PaperWorkload(pods, nodes, o.tune, seed, o.fileOrder)
			show := func(done int) { progress.show(p, seed, done, len(w.Pods)) }
			var res Result
			var err error
			if slices.Contains(PaperPolicies, p) {
				res, err = ReplayPaper(ctx, nodes, pods, w, p, seed, show)
			} else {
				res, err = Replay(ctx, nodes, w.Pods, placement.Policy(p), seed, show)
			}
			if err != nil {
				return err
			}
			per = append(per, res)
		}
		progress.clear()
		results = append(results, per)
		s := summarize(per)
		fmt.Fprintf(stdout, "%s alloc@100=%.2f%% alloc@130=%.2f%% failed=%d seeds=%d time=%.1fs\n", p, s.alloc[100], s.alloc[MaxArrived], s.failed, len(per), s.wall.Seconds())
		fmt.Fprintf(stderr, "%s decision p50=%s p99=%s over %d decisions\n", p, s.p50, s.p99, s.decisions)
	}
	if o.csv != "" {
		if err := writeFile(o.csv, func(w io.Writer) error { return writeCSV(w, results) }); err != nil {
			return err
		}
	}
	if o.plot != "" {
		if err := writeFile(o.plot, func(w io.Writer) error { return writeSVG(w, results, o.pods) }); err != nil {
			return err
		}
	}
	return nil
}

// summary is one policy's results over its seeds.
type summary struct {
	alloc          [MaxArrived + 1]float64
	failed         int
	wall, p50, p99 time.Duration
	decisions      int
}

func summarize(per []Result) summary {
	var s summary
	var all []time.Duration
	failed := 0
	for _, r := range per {
		for i := range s.alloc {
			s.alloc[i] += r.Alloc[i] / float64(len(per))
		}
		failed += r.FailedPods
		s.wall += r.Wall / time.Duration(len(per))
		all = append(all, r.Decisions...)
	}
	s.failed = (failed + len(per)/2) / max(len(per), 1)
	slices.Sort(all)
	if s.decisions = len(all); len(all) > 0 {
		s.p50 = all[len(all)*50/100]
		s.p99 = all[min(len(all)*99/100, len(all)-1)]
	}
	return s
}

// writeFile writes path whole or reports why not, never leaving it half
// written without saying so.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeCSV(w io.Writer, results [][]Result) error {
	if _, err := fmt.Fprintln(w, "policy,seed,arrived_pct,alloc_pct,failed_pods,frag_milli_gpu"); err != nil {
		return err
	}
	for _, per := range results {
		for _, r := range per {
			for p := 0; p <= MaxArrived; p++ {
				frag := "" // a paper policy keeps no fragmentation model
				if !math.IsNaN(r.Frag[p]) {
					frag = strconv.FormatFloat(r.Frag[p], 'f', 1, 64)
				}
				if _, err := fmt.Fprintf(w, "%s,%d,%d,%.4f,%d,%s\n", r.Policy, r.Seed, p, r.Alloc[p], r.Failed[p], frag); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// progress shows how far a replay is: on a terminal one line written over
// in place; elsewhere (a log, a pipe) a plain line as each seed ends, so
// that what is kept reads as lines.
type progress struct {
	w        io.Writer
	terminal bool
}

func progressLine(w io.Writer) progress {
	f, ok := w.(*os.File)
	if !ok {
		return progress{w: w}
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return progress{w: w, terminal: err == nil}
}

func (p progress) show(policy string, seed uint64, done, total int) {
	switch {
	case p.terminal:
		fmt.Fprintf(p.w, "\r%s seed %d: %d/%d pods (%d%%)   ", policy, seed, done, total, done*100/max(total, 1))
	case done == total:
		fmt.Fprintf(p.w, "%s seed %d: %d pods placed\n", policy, seed, total)
	}
}

// clear wipes the terminal's progress line before the results.
func (p progress) clear() {
	if p.terminal {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
