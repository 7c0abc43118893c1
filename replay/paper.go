package replay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The FGD paper's baselines and FGD itself, as its artifact
// (hkust-adsl/kubernetes-scheduler-simulator, pkg/simulator/plugin) scores
// them: replay-only policies, so that the replay can show it reproduces the
// published figures before comparing gpulet with them. Each node that passes
// the filters (CPU and memory left, GPU model, a GPU or whole GPUs with room)
// gets an integer score; the highest wins, ties go to the lowest NodeRank
// (the artifact keeps the smallest node name, prefixed by a seeded rank).
// Then the node's GPU is chosen as the artifact's Open-Gpu-Share Reserve
// does: the tightest GPU with room for a fractional pod (FGD: the one of the
// best score), the free GPUs of lowest index for whole ones.
const (
	PaperBestFit    = "paper-bestfit"
	PaperGpuPacking = "paper-gpupacking"
	PaperDotProd    = "paper-dotprod"
	PaperClustering = "paper-clustering"
	PaperFGD        = "paper-fgd"
)

// PaperPolicies lists the replay-only policies.
var PaperPolicies = []string{PaperBestFit, PaperGpuPacking, PaperDotProd, PaperClustering, PaperFGD}

// The artifact's constants (pkg/type/open-gpu-share/utils/const.go and the
// scheduler framework's score range).
const (
	maxSpecCPU   = 128000 // milli-CPU
	maxSpecGPU   = 8000   // milli-GPU
	maxNodeScore = 100
	milliPerGPU  = 1000
	fgdThreshold = 95 // the typical pods' popularity threshold, %
	shareGPUAff  = "share-gpu"
)

// shape is a pod as the artifact's scores see it (its PodResource): CPU,
// milli-GPU per GPU, GPUs and the GPU models it accepts, joined by "|".
type shape struct {
	cpu   int64
	milli int64
	gpus  int
	spec  string
}

func shapeOf(p Pod) shape {
	if p.GPUs == 0 {
		// The artifact's pod YAML sets no GPU annotation, gpu_spec included,
		// for a pod of no GPU.
		return shape{cpu: int64(p.CPUMilli)}
	}
	return shape{cpu: int64(p.CPUMilli), milli: int64(p.perGPUMilli()), gpus: p.GPUs, spec: strings.Join(p.Models, "|")}
}

func (s shape) total() int64 { return s.milli * int64(s.gpus) }

// affinity is the artifact's GPU affinity of a pod (GpuClustering).
func (s shape) affinity() string {
	if s.gpus == 1 && s.milli < milliPerGPU {
		return shareGPUAff
	}
	return strconv.Itoa(s.gpus) + "-gpu"
}

// paperNode is one node as the artifact's NodeResource sees it, with its
// memory for the scheduler's own fit filter.
type paperNode struct {
	model    string
	cpuLeft  int64
	memLeft  uint64
	gpuLeft  []int64
	affinity map[string]int // GPU pods placed, by affinity (GpuClustering)
	// What follows is derived from the above, kept until the node changes:
	// its milli-GPU left, its free GPUs, and under FGD its fragmentation
	// now (when fragValid) and its score by shape.
	totalLeft int64
	freeGPUs  int
	frag      float64
	fragValid bool
	memo      map[shape]int64
}

// changed drops what was derived from the node's resources.
func (n *paperNode) changed() {
	n.memo, n.fragValid = nil, false
	n.totalLeft, n.freeGPUs = 0, 0
	for _, l := range n.gpuLeft {
		n.totalLeft += l
		if l == milliPerGPU {
			n.freeGPUs++
		}
	}
}

// accessible is the artifact's IsNodeAccessibleToPodByType.
func accessible(model, spec string) bool {
	if spec == "" {
		return true
	}
	if model == "" {
		return false
	}
	for _, m := range strings.Split(spec, "|") {
		if m == model {
			return true
		}
	}
	return false
}

// fits is the filters: the scheduler's NodeResourcesFit (CPU, memory) and
// Open-Gpu-Share's (a GPU pod needs GPUs of its model with room).
func (n *paperNode) fits(s shape, mem uint64) bool {
	if n.cpuLeft < s.cpu || n.memLeft < mem {
		return false
	}
	if s.total() <= 0 {
		return true
	}
	if len(n.gpuLeft) == 0 || !accessible(n.model, s.spec) {
		return false
	}
	room := 0
	for _, l := range n.gpuLeft {
		if l >= s.milli {
			room++
		}
	}
	return room >= s.gpus
}

// paperSim is one replay of a paper policy.
type paperSim struct {
	policy  string
	nodes   []paperNode
	typical []typicalPod
}

func newPaperSim(policy string, nodes []TraceNode, pods []Pod) (*paperSim, error) {
	known := false
	for _, p := range PaperPolicies {
		known = known || p == policy
	}
	if !known {
		return nil, fmt.Errorf("unknown paper policy %q", policy)
	}
	s := &paperSim{policy: policy, nodes: make([]paperNode, len(nodes))}
	for i, tn := range nodes {
		n := &s.nodes[i]
		n.model, n.cpuLeft, n.memLeft = tn.Model, int64(tn.CPUMilli), tn.MemoryMiB
		n.gpuLeft = make([]int64, tn.GPUs)
		for g := range n.gpuLeft {
			n.gpuLeft[g] = milliPerGPU
		}
		n.affinity = map[string]int{}
		n.changed()
	}
	if policy == PaperFGD {
		s.typical = typicalPods(pods)
	}
	return s, nil
}

// score is the node's score for s under the policy (the artifact's
// plugins, each read in its file named in the comment).
func (sim *paperSim) score(n *paperNode, s shape) int64 {
	switch sim.policy {
	case PaperBestFit: // best_fit_score.go
		v := float64(n.cpuLeft-s.cpu)/maxSpecCPU*0.5 + float64(n.totalLeft-s.total())/maxSpecGPU*0.5
		return int64((1.0 - v) * maxNodeScore)
	case PaperDotProd: // dot_product_score.go, dimExt "merge", norm "max"
		dot := float64(n.cpuLeft)/maxSpecCPU*(float64(s.cpu)/maxSpecCPU) + float64(n.totalLeft)/maxSpecGPU*(float64(s.total())/maxSpecGPU)
		return int64(maxNodeScore * (1 - dot/2))
	case PaperGpuPacking: // gpu_packing_score.go
		return packingScore(n, s)
	case PaperClustering: // gpu_clustering_score.go
		if s.gpus == 0 {
			return 0
		}
		base := int64(maxNodeScore/4) * (maxSpecGPU - n.totalLeft) / maxSpecGPU
		switch a := s.affinity(); {
		case n.affinity[a] > 0 && len(n.affinity) == 1:
			return base + maxNodeScore*3/4
		case n.affinity[a] > 0:
			return base + maxNodeScore*2/4
		case len(n.affinity) == 0:
			return base + maxNodeScore/4
		default:
			return base
		}
	default: // PaperFGD, fgd_score.go
		if v, ok := n.memo[s]; ok {
			return v
		}
		v, _ := sim.fgd(n, s)
		if n.memo == nil {
			n.memo = map[shape]int64{}
		}
		n.memo[s] = v
		return v
	}
}

// packingScore is GpuPacking: a pod that fits on GPUs in use scores
// highest, then one that needs free GPUs of a node in use, then an empty
// node, fewer free GPUs first.
func packingScore(n *paperNode, s shape) int64 {
	if s.total() <= 0 {
		return 0
	}
	free := n.freeGPUs
	if free == len(n.gpuLeft) {
		return max(maxNodeScore/3-int64(free), int64(free))
	}
	need, freeUsed := s.gpus, 0
	var used []int64
	for _, g := range ascending(n.gpuLeft) {
		if need == 0 {
			break
		}
		if l := n.gpuLeft[g]; s.milli <= l {
			need--
			used = append(used, l)
			if l == milliPerGPU {
				freeUsed++
			}
		}
	}
	if freeUsed > 0 {
		return max(maxNodeScore/2-int64(freeUsed), maxNodeScore/3)
	}
	var ratio int64
	for _, l := range used {
		ratio += l * 100 / milliPerGPU
	}
	return max(maxNodeScore-ratio/10, maxNodeScore/2)
}

// ascending is the GPU indices by milli-GPU left, least first, stable
// (NodeResource.SortedMilliGpuLeftIndexList).
func ascending(left []int64) []int {
	idx := make([]int, len(left))
	for i := range idx {
		idx[i] = i
	}
	// Insertion sort: stable, and a node has at most a few GPUs.
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && left[idx[j]] < left[idx[j-1]]; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	return idx
}

// reserve places s on n, which fits it.
func (sim *paperSim) reserve(n *paperNode, s shape, mem uint64) {
	n.cpuLeft -= s.cpu
	n.memLeft -= mem
	if s.total() > 0 {
		if s.milli < milliPerGPU {
			g := -1
			if sim.policy == PaperFGD {
				_, g = sim.fgd(n, s)
			} else {
				for i, l := range n.gpuLeft {
					if l >= s.milli && (g == -1 || l < n.gpuLeft[g]) {
						g = i
					}
				}
			}
			n.gpuLeft[g] -= s.milli
		} else {
			need := s.gpus
			for i, l := range n.gpuLeft {
				if need > 0 && l == milliPerGPU {
					n.gpuLeft[i] = 0
					need--
				}
			}
		}
		n.affinity[s.affinity()]++
	}
	n.changed()
}

// place puts p on the node of the best score, the lowest rank among equals,
// and returns the node's index; -1 if no node fits p.
func (sim *paperSim) place(p Pod, rank []int) int {
	s := shapeOf(p)
	best, bestScore := -1, int64(0)
	for j := range sim.nodes {
		n := &sim.nodes[j]
		if !n.fits(s, p.MemoryMiB) {
			continue
		}
		v := sim.score(n, s)
		if best == -1 || v > bestScore || (v == bestScore && rank[j] < rank[best]) {
			best, bestScore = j, v
		}
	}
	if best >= 0 {
		sim.reserve(&sim.nodes[best], s, p.MemoryMiB)
	}
	return best
}

// paperReplay places w's pods one by one under a paper policy and returns,
// after each pod, the arrived and allocated milli-GPU and the pods failed,
// and the time each decision took.
func paperReplay(ctx context.Context, nodes []TraceNode, pods []Pod, w Workload, policy string, progress func(done int)) (arrived, allocated []int64, failedAt []int, decisions []time.Duration, err error) {
	sim, err := newPaperSim(policy, nodes, pods)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	arrived, allocated = make([]int64, len(w.Pods)), make([]int64, len(w.Pods))
	failedAt, decisions = make([]int, len(w.Pods)), make([]time.Duration, len(w.Pods))
	var arr, alloc int64
	failed := 0
	for i, p := range w.Pods {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, nil, nil, nil, err
			}
			if progress != nil {
				progress(i)
			}
		}
		t0 := time.Now()
		if sim.place(p, w.NodeRank) < 0 {
			failed++
		} else {
			alloc += int64(p.Milli())
		}
		arr += int64(p.Milli())
		decisions[i] = time.Since(t0)
		arrived[i], allocated[i], failedAt[i] = arr, alloc, failed
	}
	if progress != nil {
		progress(len(w.Pods))
	}
	return arrived, allocated, failedAt, decisions, nil
}
