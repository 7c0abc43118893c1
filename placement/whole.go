package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gpulet/gpulet/internal/errdefs"
)

// A whole-GPU request (Request.GPUs = N) takes N GPUs of the node, every unit
// of each, with no MPS client and no claim on them, or nothing: never a part
// of them. The job then runs without MPS, as on a dedicated GPU. Among the
// whole GPUs, N of one NUMA node come first when the topology is known.

// wholeNow says why g, which could take r some day, is not whole now.
func wholeNow(g *GPU, r Request) reason {
	// What every request is refused for now: the GPU unusable, its memory.
	if why := gpuNow(g, Request{MemoryMiB: r.MemoryMiB}); why.kind != fits {
		return why
	}
	switch {
	case g.Free < g.Units:
		return reason{kind: notWhole, have: uint64(g.Free), want: uint64(g.Units)}
	}
	for _, in := range g.Instances {
		switch {
		case in.Down != "":
			return reason{kind: instanceDown, instance: in.Index, text: in.Down}
		case in.Clients > 0:
			return reason{kind: instanceHasClients, instance: in.Index, have: uint64(in.Clients)}
		}
	}
	return reason{}
}

// decideWhole places a whole-GPU request: all of it or nothing.
func (e *Engine) decideWhole(n *Node, r Request, acc *access, memo *Memo) (Decision, error) {
	d := Decision{Policy: e.policy}
	if r.GPU != "" {
		return d, errdefs.Errorf(errdefs.ErrInvalid, "gpu: a request for whole GPUs cannot name one GPU")
	}
	possible := 0
	var whole []int // positions in n.GPUs
	d.Verdicts = make([]Verdict, 0, len(n.GPUs))
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		why, _ := e.gpuAccess(acc, g)
		if why.kind == fits {
			why = never(g, Request{Type: r.Type, MemoryMiB: r.MemoryMiB, MinCC: r.MinCC})
		}
		if why.kind == fits {
			possible++
			why = wholeNow(g, r)
		}
		if why.kind == fits {
			whole = append(whole, gi)
		}
		d.Verdicts = append(d.Verdicts, Verdict{GPU: g.Index, Kept: why.kind == fits, Why: why.String()})
	}
	if len(whole) < r.GPUs {
		return d, wholeRefusal(r, d.Verdicts, possible, len(whole))
	}
	chosen := e.pickWhole(n, whole, r.GPUs)
	d.Choice = Choice{GPU: n.GPUs[chosen[0]].Index}
	for _, gi := range chosen {
		d.Choice.GPUs = append(d.Choice.GPUs, n.GPUs[gi].Index)
		d.Best.GPUFree += n.GPUs[gi].Units
	}
	d.Best.GPU, d.Best.Free = chosen[0], len(whole)
	if e.policy == Frag {
		d.Best.Frag = roundScore(e.wholeDelta(n, r, chosen, memo))
		d.Best.Align = HostAlign(n, r)
	}
	return d, nil
}

// wholeDelta is the frag policy's figure for taking the GPUs chosen whole.
func (e *Engine) wholeDelta(n *Node, r Request, chosen []int, memo *Memo) float64 {
	fs := memo.fragScorer(n, e.mix)
	if fs.mix == nil {
		return 0
	}
	var buf [maxStackGPUs]int
	after := fragState{free: append(buf[:0], fs.base.free...), cpuFree: fs.base.cpuFree, memFree: fs.base.memFree}
	for _, gi := range chosen {
		after.free[gi] = 0
	}
	if n.Host != nil {
		after.cpuFree -= min(after.cpuFree, r.HostCPUMilli)
		after.memFree -= min(after.memFree, r.HostMemoryMiB)
	}
	return fragmentation(n, fs.mix, after, fs.accept) - fs.before
}

// pickWhole chooses want of the whole GPUs (positions, ascending). When one
// NUMA node has enough, they come from one NUMA node: under spread the one
// with the most whole GPUs, under first-fit the one holding the lowest
// index, otherwise the one with the fewest (best fit: larger groups stay
// whole for larger requests). Else the NUMA nodes with the most whole GPUs
// give first, so that the GPUs span as few of them as they can.
func (e *Engine) pickWhole(n *Node, whole []int, want int) []int {
	groups := map[int][]int{}
	var numas []int
	for _, gi := range whole {
		k := n.GPUs[gi].NUMANode
		if _, ok := groups[k]; !ok {
			numas = append(numas, k)
		}
		groups[k] = append(groups[k], gi)
	}
	best := -1
	for _, k := range numas {
		size := len(groups[k])
		if size < want {
			continue
		}
		switch {
		case best < 0:
			best = k
		case e.policy == Spread && size > len(groups[best]):
			best = k
		case e.policy != Spread && e.policy != FirstFit && size < len(groups[best]):
			best = k
		}
	}
	if best >= 0 {
		return groups[best][:want]
	}
	slices.SortStableFunc(numas, func(a, b int) int { return cmp.Compare(len(groups[b]), len(groups[a])) })
	var out []int
	for _, k := range numas {
		out = append(out, groups[k]...)
	}
	out = out[:want]
	slices.Sort(out)
	return out
}

// wholeRefusal explains why fewer than r.GPUs whole GPUs could be had.
func wholeRefusal(r Request, verdicts []Verdict, possible, whole int) error {
	var whys []string
	for _, v := range verdicts {
		if !v.Kept {
			whys = append(whys, fmt.Sprintf("GPU %d %s", v.GPU, v.Why))
		}
	}
	detail := ""
	if len(whys) > 0 {
		detail = ": " + strings.Join(whys, "; ")
	}
	if possible < r.GPUs {
		return &neverFits{errdefs.Errorf(errdefs.ErrNoCapacity, "%s: %d whole GPU(s)%s asked, and this node has only %d that could ever be given whole%s", ErrNeverFits, r.GPUs, describe(r), possible, detail)}
	}
	return errdefs.Errorf(errdefs.ErrNoCapacity, "%d whole GPU(s)%s asked, %d of them whole now%s", r.GPUs, describe(r), whole, detail)
}
