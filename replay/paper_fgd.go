package replay

import (
	"cmp"
	"math"
	"slices"
)

// FGD as its artifact computes it (pkg/utils/frag.go,
// pkg/simulator/plugin/fgd_score.go): a node's fragmentation is the GPU it
// has free that each typical pod could not use, weighed by how often that
// pod occurs; a node's score for a pod is how much placing the pod lowers
// that, squashed: int(100 × sigmoid(Δ / 1000)), so that nodes whose Δ
// differ by a few tens of milli-GPU tie, and the tie-break decides.

// typicalPod is one of the workload's most frequent shapes and its share.
type typicalPod struct {
	s   shape
	pct float64
}

// typicalPods is the artifact's GetTypicalPods as the published runs
// configure it (isInvolvedCpuPods true, podPopularityThreshold 95,
// podIncreaseStep 1, gpuResWeight 0): over the whole pod list, before
// tuning, the shapes from the most frequent down until they count 95% of
// the pods, their shares renormalized to sum to 1.
func typicalPods(pods []Pod) []typicalPod {
	count := map[shape]float64{}
	var total float64
	for _, p := range pods {
		count[shapeOf(p)]++
		total++
	}
	list := make([]typicalPod, 0, len(count))
	for s, c := range count {
		list = append(list, typicalPod{s, c})
	}
	// Most frequent first; among equals, the larger shape first (the
	// artifact sorts by sort.Reverse of share, then CPU, milli-GPU, GPUs,
	// models).
	slices.SortFunc(list, func(a, b typicalPod) int {
		return -cmp.Or(cmp.Compare(a.pct, b.pct), cmp.Compare(a.s.cpu, b.s.cpu), cmp.Compare(a.s.milli, b.s.milli),
			cmp.Compare(a.s.gpus, b.s.gpus), cmp.Compare(a.s.spec, b.s.spec))
	})
	expected := float64(fgdThreshold) * total / 100.0
	var cum float64
	i := 0
	for cum < expected && i < len(list) {
		cum += list[i].pct
		list[i].pct /= total
		i++
	}
	if i >= len(list) {
		return list
	}
	out := list[:i]
	for j := range out {
		out[j].pct /= cum / total
	}
	return out
}

// The artifact's fragment kinds of a node for one typical pod
// (GetNodePodFrag), in its order: a frag amount is summed over all but q3.
const (
	q1LackBoth = iota
	q2LackGPU
	q3Satisfied
	q4LackCPU
	xlSatisfied
	xrLackCPU
	noAccess
	fragKinds
)

// fragOf is NodeGpuShareFragAmountScore for a node of model with cpuLeft
// and gpuLeft, summed in the artifact's order so that the score, whose
// truncation makes ties, is the same to the last bit.
func fragOf(model string, cpuLeft int64, gpuLeft []int64, typical []typicalPod) float64 {
	var data [fragKinds]float64
	var total int64
	for _, l := range gpuLeft {
		total += l
	}
	for _, t := range typical {
		kind := podFrag(model, cpuLeft, gpuLeft, t.s)
		if kind != q3Satisfied {
			data[kind] += t.pct * float64(total)
			continue
		}
		var short int64 // on GPUs too full for the pod
		for _, l := range gpuLeft {
			if l < t.s.milli {
				short += l
			}
		}
		data[q2LackGPU] += t.pct * float64(short)
		data[q3Satisfied] += t.pct * float64(total-short)
	}
	var out float64
	for k, v := range data {
		if k != q3Satisfied {
			out += v
		}
	}
	return out
}

func podFrag(model string, cpuLeft int64, gpuLeft []int64, s shape) int {
	cpuOK := cpuLeft >= s.cpu
	if s.milli == 0 {
		if cpuOK {
			return xlSatisfied
		}
		return xrLackCPU
	}
	if !accessible(model, s.spec) {
		return noAccess
	}
	room := 0
	for _, l := range gpuLeft {
		if l >= s.milli {
			room++
		}
	}
	switch {
	case room >= s.gpus && cpuOK:
		return q3Satisfied
	case room >= s.gpus:
		return q4LackCPU
	case cpuOK:
		return q2LackGPU
	default:
		return q1LackBoth
	}
}

func fgdScore(before, after float64) int64 {
	return int64(1.0 / (1.0 + math.Exp(-(before-after)/1000)) * maxNodeScore)
}

// fgd is FGD's score of n for s, and for a pod of part of one GPU the GPU
// it would take (the first of the best score); -1 for others.
func (sim *paperSim) fgd(n *paperNode, s shape) (int64, int) {
	if !n.fragValid {
		n.frag, n.fragValid = fragOf(n.model, n.cpuLeft, n.gpuLeft, sim.typical), true
	}
	left := slices.Clone(n.gpuLeft)
	if s.gpus == 1 && s.milli < milliPerGPU {
		best, gpu := int64(0), -1
		for i, l := range n.gpuLeft {
			if l < s.milli {
				continue
			}
			left[i] = l - s.milli
			v := fgdScore(n.frag, fragOf(n.model, n.cpuLeft-s.cpu, left, sim.typical))
			left[i] = l
			if gpu == -1 || v > best {
				best, gpu = v, i
			}
		}
		return best, gpu
	}
	// NodeResource.Sub: the GPUs with the least left that have room.
	need := s.gpus
	for _, g := range ascending(left) {
		if need > 0 && left[g] >= s.milli {
			left[g] -= s.milli
			need--
		}
	}
	return fgdScore(n.frag, fragOf(n.model, n.cpuLeft-s.cpu, left, sim.typical)), -1
}
