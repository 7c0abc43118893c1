package replay

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpulet/gpulet/placement"
)

// BenchmarkReplayDefault is one seed (42) of one policy on the default
// openb list, as gpulet-replay runs it: the goal is ≤ 5 s a seed on 2 CPUs,
// ≤ 10 s for paper-fgd. paper-bestfit, which scores every node that fits
// each pod with a few operations, is the floor the others are read against
// (docs/BENCHMARKS.md).
func BenchmarkReplayDefault(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "traces", "openb")
	if _, err := os.Stat(dir); err != nil {
		b.Skipf("the openb trace is not at %s: %v", dir, err)
	}
	nodes, err := readFile(filepath.Join(dir, "openb_node_list_gpu_node.csv"), ReadNodes)
	if err != nil {
		b.Fatal(err)
	}
	pods, err := readFile(filepath.Join(dir, "openb_pod_list_default.csv"), ReadPods)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{PaperBestFit, PaperFGD, string(placement.BestFit), string(placement.Frag)} {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				w := PaperWorkload(pods, nodes, 1.3, 42, false)
				if slices.Contains(PaperPolicies, p) {
					_, err = ReplayPaper(context.Background(), nodes, pods, w, p, 42, nil)
				} else {
					_, err = Replay(context.Background(), nodes, w.Pods, placement.Policy(p), 42, nil)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
