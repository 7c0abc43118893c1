package placement

import "github.com/gpulet/gpulet/internal/errdefs"

// Host is the CPU and memory of the node's host, for a decision that must
// respect them: a cluster placement over nodes whose CPU and memory run out
// before their GPUs do. gpuletd leaves Node.Host nil: it leases GPUs only.
type Host struct {
	CPUMilli, MemoryMiB         uint64
	CPUMilliFree, MemoryMiBFree uint64
}

// hostRefusal says why n's host cannot take r: never (more than it has) or
// not now (more than it has free); nil when it can or n has no Host.
func hostRefusal(n *Node, r Request) error {
	h := n.Host
	if h == nil || r.HostCPUMilli == 0 && r.HostMemoryMiB == 0 {
		return nil
	}
	switch {
	case r.HostCPUMilli > h.CPUMilli:
		return &neverFits{errdefs.Errorf(errdefs.ErrNoCapacity, "%s: the host has %d millicores, %d asked", ErrNeverFits, h.CPUMilli, r.HostCPUMilli)}
	case r.HostMemoryMiB > h.MemoryMiB:
		return &neverFits{errdefs.Errorf(errdefs.ErrNoCapacity, "%s: the host has %d MiB of memory, %d asked", ErrNeverFits, h.MemoryMiB, r.HostMemoryMiB)}
	case r.HostCPUMilli > h.CPUMilliFree:
		return errdefs.Errorf(errdefs.ErrNoCapacity, "the host has %d millicores free, %d asked", h.CPUMilliFree, r.HostCPUMilli)
	case r.HostMemoryMiB > h.MemoryMiBFree:
		return errdefs.Errorf(errdefs.ErrNoCapacity, "the host has %d MiB of memory free, %d asked", h.MemoryMiBFree, r.HostMemoryMiB)
	}
	return nil
}

// hostOnly places a request that asks no GPU: the host alone decides, and
// the choice names no GPU (-1).
func (e *Engine) hostOnly(n *Node, r Request, memo *Memo) Decision {
	d := Decision{Policy: e.policy, Choice: Choice{GPU: -1, Instance: -1}}
	if e.policy == Frag {
		d.Best.Frag = roundScore(memo.fragScorer(n, e.mix).delta(r, -1, 0))
		d.Best.Align = HostAlign(n, r)
	}
	return d
}
