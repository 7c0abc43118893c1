package replay

import (
	"math"
	"math/rand" // v1 on purpose: a seeded v1 source gives the paper's sequence on every platform
	"slices"
	"strconv"
	"strings"
)

// Workload is what one seed of the published protocol replays: the pods in
// the order they arrive, and the order the paper's scheduler breaks ties
// between nodes in.
type Workload struct {
	Pods []Pod
	// NodeRank[i] is where nodes[i] stands when the paper's scheduler
	// breaks a tie: the lowest rank wins. The artifact prefixes every node's
	// name with its place in a seeded permutation and keeps the smallest
	// name among nodes of equal score.
	NodeRank []int
}

// PaperWorkload is one seed of the FGD paper's protocol as its artifact
// (hkust-adsl/kubernetes-scheduler-simulator) runs it:
//
//   - Go's math/rand seeded with seed, and one Int() drawn at once
//     (pkg/simulator/core.go, Simulate: an argument of a debug log line);
//   - the pods sorted by name, then rand.Shuffle'd (simulator.go,
//     SortClusterPods; every published run has --shuffle-pod=true) unless
//     fileOrder, which keeps the file's order (not the paper's protocol);
//   - tuned to ratio × the cluster's milli-GPU (TunePodsByNodeTotalResource):
//     below it, pods drawn with Intn from the pods sorted by name are
//     appended until the first draw whose per-GPU milli would pass the
//     target (tuneUpPods); above it, pods at Intn of the list are removed
//     until it is not (tuneDownPods);
//   - ten numbers drawn by the simulated scheduler as it starts
//     (informerDraws), then the nodes sorted by name and ranked by
//     rand.Perm (syncClusterResourceList), for the tie-break.
func PaperWorkload(pods []Pod, nodes []TraceNode, ratio float64, seed uint64, fileOrder bool) Workload {
	rng := rand.New(rand.NewSource(int64(seed)))
	rng.Int()
	byName := slices.Clone(pods)
	slices.SortFunc(byName, func(a, b Pod) int { return strings.Compare(a.Name, b.Name) })
	work := slices.Clone(byName)
	if fileOrder {
		work = slices.Clone(pods)
	} else {
		rng.Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
	}
	work = tune(work, byName, Capacity(nodes), ratio, rng)

	sorted := make([]int, len(nodes))
	for i := range sorted {
		sorted[i] = i
	}
	slices.SortFunc(sorted, func(a, b int) int { return strings.Compare(nodes[a].Name, nodes[b].Name) })
	for range informerDraws {
		rng.Float64()
	}
	rank := make([]int, len(nodes))
	for i, p := range rng.Perm(len(nodes)) {
		rank[sorted[i]] = p
	}
	return Workload{Pods: work, NodeRank: rank}
}

// informerDraws is how many numbers the artifact's global math/rand gives
// away between the tuning and the node permutation: when the simulated
// scheduler starts, each of its ten informers draws one rand.Float64 for
// its watch's timeout (client-go tools/cache/reflector.go, ListAndWatch).
// Ten is also the only count from 0 to 14 with which the published
// per-seed figures of the baselines come out exact.
const informerDraws = 10

// tune is the artifact's TunePodsByNodeTotalResource: draws come from
// byName, the original pods sorted by name.
func tune(work, byName []Pod, capacity int64, ratio float64, rng *rand.Rand) []Pod {
	target := ratio * float64(capacity)
	var total int64
	for _, p := range work {
		total += int64(p.Milli())
	}
	switch {
	case ratio <= 0 || float64(total) == target || len(byName) == 0:
	case float64(total) > target:
		for float64(total) > target && len(work) > 0 {
			i := rng.Intn(len(work))
			total -= int64(work[i].Milli())
			work = slices.Delete(work, i, i+1)
		}
	default:
		for i := 0; ; i++ {
			p := byName[rng.Intn(len(byName))]
			// The artifact compares the pod's milli-GPU per GPU, not its
			// total, with what is left: a pod of 8 GPUs may pass the
			// target by up to 7 GPUs.
			if float64(total+int64(p.perGPUMilli())) > target {
				break
			}
			total += int64(p.Milli())
			p.Name += "-tuned-" + strconv.Itoa(i)
			work = append(work, p)
		}
	}
	return work
}

// perGPUMilli is the pod's milli-GPU per GPU: gpu_milli for a pod of one
// GPU, 1000 for one of several, 0 for one of none.
func (p Pod) perGPUMilli() int {
	if p.GPUs > 1 {
		return 1000
	}
	return p.Milli()
}

// Figure is the paper's allocation ratio at each arrived percent, as the
// artifact's analysis computes it (experiments/analysis/merge_alloc_discrete.py):
// after every pod, placed or not, the arrived percent rounded to a whole
// one (half to even) and the allocated percent rounded to two decimals;
// the figure at p is the mean of the allocated percents of the pods whose
// arrived percent rounds to p, or, when none does, of those whose arrived
// percent rounds within p ± 1. Where that finds no pod either (the artifact
// leaves the figure out; it happens on small lists, not on openb's), it is
// the allocated percent after the last pod that arrived below p, 0 before
// the first. arrived and allocated are milli-GPU after each pod; capacity
// the cluster's milli-GPU.
func Figure(arrived, allocated []int64, capacity int64) [MaxArrived + 1]float64 {
	var sum, last [MaxArrived + 2]float64
	var n [MaxArrived + 2]int
	var seen [MaxArrived + 2]bool
	gpus := float64(capacity / UnitsPerGPU)
	for i := range arrived {
		at := float64(arrived[i]) / gpus / 10
		alloc := round2(float64(allocated[i]) / gpus / 10)
		if p := math.RoundToEven(at); p >= 0 && p <= MaxArrived+1 {
			sum[int(p)] += alloc
			n[int(p)]++
		}
		if c := math.Ceil(at); c <= MaxArrived {
			last[int(max(c, 0))], seen[int(max(c, 0))] = alloc, true
		}
	}
	var out [MaxArrived + 1]float64
	held := 0.0
	for p := range out {
		if seen[p] {
			held = last[p]
		}
		s, c := sum[p], n[p]
		if c == 0 {
			for q := max(p-1, 0); q <= p+1; q++ {
				s, c = s+sum[q], c+n[q]
			}
		}
		out[p] = held
		if c > 0 {
			// pandas' mean is a NumPy float, whose round(x, 2) is
			// rint(x × 100) / 100.
			out[p] = math.RoundToEven(s/float64(c)*100) / 100
		}
	}
	return out
}

// round2 rounds to two decimals as Python's round(x, 2) does on the
// Python floats pandas' apply hands it: the exact binary value, correctly
// rounded.
func round2(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	return v
}
