package replay

import (
	"math"
	"slices"
	"testing"
)

// placeAll places pods in order under a paper policy, nodes ranked as given.
func placeAll(t *testing.T, policy string, nodes []TraceNode, rank []int, pods []Pod) *paperSim {
	t.Helper()
	sim, err := newPaperSim(policy, nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		sim.place(p, rank)
	}
	return sim
}

func TestPaperBestFit(t *testing.T) {
	nodes := []TraceNode{{"big", 64000, 1024, 8, "T4"}, {"small", 32000, 1024, 2, "T4"}, {"small2", 32000, 1024, 2, "T4"}}
	// The tightest node in CPU and GPU together takes the pod; of the two
	// alike, the one of lower rank.
	sim := placeAll(t, PaperBestFit, nodes, []int{0, 2, 1}, []Pod{{Name: "a", CPUMilli: 1000, MemoryMiB: 1, GPUs: 1, GPUMilli: 300}})
	if sim.nodes[2].cpuLeft != 31000 || sim.nodes[1].cpuLeft != 32000 {
		t.Errorf("cpu left %d, %d: want the pod on small2 (rank 1)", sim.nodes[1].cpuLeft, sim.nodes[2].cpuLeft)
	}
	// The score is the artifact's: (1 − ½ CPU left/128 cores − ½ GPU
	// left/8 GPUs) × 100, truncated.
	n := &sim.nodes[0]
	// Here: 1 − ½ × 32/128 − ½ × 4/8 = 0.625.
	if got := sim.score(n, shape{cpu: 32000, milli: 1000, gpus: 4}); got != 62 {
		t.Errorf("score %d", got)
	}
	// Memory is filtered as the scheduler's fit does; so is the model.
	if n.fits(shape{cpu: 1}, 2048) || n.fits(shape{cpu: 1, milli: 500, gpus: 1, spec: "V100M16|A10"}, 1) || !n.fits(shape{cpu: 1, milli: 500, gpus: 1, spec: "A10|T4"}, 1) {
		t.Error("the filters let through what the node cannot take, or kept out what it can")
	}
}

// A fractional pod takes the tightest GPU with room (the lowest index of
// equals); whole GPUs, the free ones of lowest index.
func TestPaperReserve(t *testing.T) {
	sim, err := newPaperSim(PaperBestFit, []TraceNode{{"n", 64000, 1024, 4, "T4"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := &sim.nodes[0]
	copy(n.gpuLeft, []int64{1000, 600, 400, 600})
	n.changed()
	sim.reserve(n, shape{cpu: 1, milli: 500, gpus: 1}, 0)
	sim.reserve(n, shape{cpu: 1, milli: 1000, gpus: 1}, 0)
	if !slices.Equal(n.gpuLeft, []int64{0, 100, 400, 600}) || n.affinity["share-gpu"] != 1 || n.affinity["1-gpu"] != 1 {
		t.Errorf("GPUs left %v, affinity %v", n.gpuLeft, n.affinity)
	}
	if _, err := newPaperSim("paper-random", nil, nil); err == nil {
		t.Error("an unknown paper policy was taken")
	}
}

func TestPaperGpuPackingAndClustering(t *testing.T) {
	node := func(left ...int64) *paperNode {
		n := &paperNode{gpuLeft: left, affinity: map[string]int{}}
		n.changed()
		return n
	}
	share := shape{cpu: 1, milli: 300, gpus: 1}
	for _, tc := range []struct {
		name string
		n    *paperNode
		s    shape
		want int64
	}{
		{"an empty node of 8", node(1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000), share, 25},
		{"an empty node of 2", node(1000, 1000), share, 31},
		{"a GPU in use with room", node(400, 1000), share, 100 - 4},
		{"a free GPU of a node in use", node(200, 1000), share, 49},
		{"no GPU asked", node(1000), shape{cpu: 1}, 0},
	} {
		if got := packingScore(tc.n, tc.s); got != tc.want {
			t.Errorf("packing, %s: %d, want %d", tc.name, got, tc.want)
		}
	}
	sim := &paperSim{policy: PaperClustering}
	n := node(500, 1000)
	// 1,500 of 8,000 milli-GPU left: 25 × 6,500 / 8,000 = 20.
	if got := sim.score(n, share); got != 20+25 {
		t.Errorf("clustering, an idle node: %d, want 45", got)
	}
	n.affinity["share-gpu"] = 1
	if got := sim.score(n, share); got != 20+75 {
		t.Errorf("clustering, a node of the pod's affinity alone: %d, want 95", got)
	}
	n.affinity["2-gpu"] = 1
	if a, b := sim.score(n, share), sim.score(n, shape{cpu: 1, milli: 1000, gpus: 4}); a != 20+50 || b != 20 {
		t.Errorf("clustering, a node of mixed affinities: %d for one of its own, %d for another; want 70, 20", a, b)
	}
	delete(n.affinity, "share-gpu")
	if got := sim.score(n, share); got != 20 {
		t.Errorf("clustering, a node of another affinity: %d, want 20", got)
	}
}

func TestTypicalPods(t *testing.T) {
	var pods []Pod
	add := func(n int, p Pod) {
		for range n {
			pods = append(pods, p)
		}
	}
	add(50, Pod{CPUMilli: 4000, GPUs: 1, GPUMilli: 1000})
	add(30, Pod{CPUMilli: 8000, GPUs: 1, GPUMilli: 500})
	add(15, Pod{CPUMilli: 2000, GPUs: 0, GPUMilli: 0, Models: []string{"T4"}}) // a pod of no GPU: its gpu_spec is not read
	add(4, Pod{CPUMilli: 2000, GPUs: 8, GPUMilli: 1000})
	add(1, Pod{CPUMilli: 1000, GPUs: 1, GPUMilli: 1000, Models: []string{"A10", "T4"}})
	got := typicalPods(pods)
	// 95 of the 100 pods: the first three shapes; their shares renormalized.
	if len(got) != 3 || got[0].s != (shape{cpu: 4000, milli: 1000, gpus: 1}) || got[2].s != (shape{cpu: 2000}) ||
		math.Abs(got[0].pct-50.0/95) > 1e-12 || math.Abs(got[1].pct+got[0].pct+got[2].pct-1) > 1e-12 {
		t.Fatalf("typical pods %+v", got)
	}
}

// FGD: a node's fragmentation is what each typical pod could not use;
// the score squashes how much placing lowers it.
func TestPaperFGD(t *testing.T) {
	typical := []typicalPod{{shape{cpu: 1000, milli: 1000, gpus: 1}, 0.5}, {shape{cpu: 1000, milli: 500, gpus: 1}, 0.5}}
	// GPUs with 1000 and 300 left: the whole-GPU pod cannot use the 300
	// (half of 300 counts), nor can the half-GPU one (half of 300).
	if got := fragOf("T4", 8000, []int64{1000, 300}, typical); got != 300 {
		t.Errorf("frag %v, want 300", got)
	}
	// Without CPU every GPU left is fragment.
	if got := fragOf("T4", 500, []int64{1000, 300}, typical); got != 1300 {
		t.Errorf("frag without CPU %v, want 1300", got)
	}
	if got := fragOf("T4", 8000, []int64{1000}, []typicalPod{{shape{cpu: 1, milli: 1000, gpus: 1, spec: "A10"}, 1}}); got != 1000 {
		t.Errorf("frag of a model the pod cannot use: %v, want 1000", got)
	}
	sim := &paperSim{policy: PaperFGD, typical: typical}
	n := &paperNode{model: "T4", cpuLeft: 8000, gpuLeft: []int64{1000, 700}, affinity: map[string]int{}}
	n.changed()
	// A pod of 200: on GPU 1 it leaves 500 (usable by the half-GPU pod:
	// frag 700/2 → 250), on GPU 0 it leaves 800 and 700 (frag 750).
	score, gpu := sim.fgd(n, shape{cpu: 1000, milli: 200, gpus: 1})
	if gpu != 1 || score != fgdScore(350, 250) || score != 52 {
		t.Errorf("fgd: GPU %d, score %d; want GPU 1, score %d", gpu, score, fgdScore(350, 250))
	}
	if got := sim.score(n, shape{cpu: 1000, milli: 200, gpus: 1}); got != score {
		t.Errorf("the kept score %d differs from the computed %d", got, score)
	}
}
