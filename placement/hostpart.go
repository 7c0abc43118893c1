package placement

// HostPart is what e's decision on n depends on of r's host part (its CPU
// and memory), for a cluster that keeps each node's answers to the requests
// it sees again: under the frag policy on a node with a Host, which shapes
// of the mix the host could no longer take once it gave r its part, one bit
// a shape; otherwise nothing (0). Two requests that differ only in their
// host part, both of which n's host can take, get the same decision from e
// on n when their HostParts are equal, but for Best.Align (HostAlign). ok is
// false when the mix has more shapes than a HostPart has bits: then the
// host part itself must tell the requests apart.
func (e *Engine) HostPart(n *Node, r Request) (part uint64, ok bool) {
	if e.policy != Frag || e.mix == nil || n.Host == nil {
		return 0, true
	}
	if len(e.mix.Shapes) > 64 {
		return 0, false
	}
	h := n.Host
	cpu := h.CPUMilliFree - min(h.CPUMilliFree, r.HostCPUMilli)
	mem := h.MemoryMiBFree - min(h.MemoryMiBFree, r.HostMemoryMiB)
	for i := range e.mix.Shapes {
		if e.mix.Shapes[i].hostCannot(cpu, mem) {
			part |= 1 << i
		}
	}
	return part, true
}
