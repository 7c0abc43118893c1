package cluster

import (
	"fmt"

	"github.com/gpulet/gpulet/pipefile"
	"github.com/gpulet/gpulet/placement"
)

// GPUSpec is one GPU of a node model: what a node's snapshot says of it when
// it is empty.
type GPUSpec struct {
	Name           string
	MemoryTotalMiB uint64
	Card           placement.Card
	NUMANode       int
}

// NodeSpec is a node model as it starts: every GPU empty, cut into Units
// units served by one MPS instance each, as gpuletd's default unit model
// does, and its host's CPU and memory all free.
type NodeSpec struct {
	Name  string
	GPUs  []GPUSpec
	Units int
	// ClientsPerInstance is the most clients one instance admits; 0: one
	// per unit.
	ClientsPerInstance  int
	CPUMilli, MemoryMiB uint64
}

// newNode builds the placement engine's view of an empty node of spec s,
// the view gpuletd's lease manager builds of its own node.
func newNode(s NodeSpec) (*placement.Node, error) {
	if s.Units <= 0 {
		return nil, fmt.Errorf("node %s: %d units per GPU, need at least 1", s.Name, s.Units)
	}
	clients := s.ClientsPerInstance
	if clients <= 0 {
		clients = s.Units
	}
	n := &placement.Node{ClientsPerInstance: clients, Host: &placement.Host{CPUMilli: s.CPUMilli, MemoryMiB: s.MemoryMiB, CPUMilliFree: s.CPUMilli, MemoryMiBFree: s.MemoryMiB}}
	// Every GPU's free list starts as the same list of all units: the
	// engine takes the head of a free list, so a GPU's list stays a tail
	// of it, and 10,000 nodes of 1000 units per GPU share one list
	// instead of holding 400 MB of their own. Nothing writes into it.
	units := make([]int, s.Units)
	for u := range units {
		units[u] = u
	}
	for gi, g := range s.GPUs {
		n.GPUs = append(n.GPUs, placement.GPU{
			Index: gi, UUID: fmt.Sprintf("%s-GPU-%d", s.Name, gi), Name: g.Name,
			MemoryTotalMiB: g.MemoryTotalMiB, MemoryFreeMiB: g.MemoryTotalMiB,
			Free: s.Units, Units: s.Units, Card: g.Card, NUMANode: g.NUMANode,
			Instances: []placement.Instance{{Index: 0, FreeUnits: units, Size: s.Units}},
		})
	}
	return n, nil
}

// commit applies a decision of the engine to node n, as a lease would: the
// units it names leave their instance's free list (a client each), a
// whole-GPU choice takes every unit of its GPUs, and the host gives the
// request's CPU and memory. The GPU memory the lease would hold leaves its
// GPUs' free memory, as gpuletd holds it (docs/design.md §1.8): its
// memory_mib, else its units' share; a whole GPU's all.
func commit(n *placement.Node, r placement.Request, c placement.Choice) {
	if h := n.Host; h != nil {
		h.CPUMilliFree -= min(h.CPUMilliFree, r.HostCPUMilli)
		h.MemoryMiBFree -= min(h.MemoryMiBFree, r.HostMemoryMiB)
	}
	switch {
	case len(c.GPUs) > 0:
		for _, idx := range c.GPUs {
			g := gpuByIndex(n, idx)
			g.Free = 0
			g.MemoryFreeMiB = 0
			for k := range g.Instances {
				g.Instances[k].FreeUnits = nil
			}
		}
	case c.GPU >= 0:
		g := gpuByIndex(n, c.GPU)
		g.Free -= len(c.Units)
		mem := r.MemoryMiB
		if mem == 0 && g.Units > 0 {
			mem = pipefile.MemoryShareMiB(len(c.Units), g.Units, g.MemoryTotalMiB)
		}
		g.MemoryFreeMiB -= min(g.MemoryFreeMiB, mem)
		for k := range g.Instances {
			in := &g.Instances[k]
			if in.Index == c.Instance {
				in.FreeUnits = without(in.FreeUnits, c.Units)
				in.Clients++
			}
		}
	}
}

func gpuByIndex(n *placement.Node, idx int) *placement.GPU {
	for gi := range n.GPUs {
		if n.GPUs[gi].Index == idx {
			return &n.GPUs[gi]
		}
	}
	panic(fmt.Sprintf("cluster: a choice names GPU %d, which the node has not", idx))
}

// without is free less taken, leaving free as it is (it may be shared).
// The engine takes the first free units, so taken is free's head, and that
// costs nothing: both ascending, the same first and last unit make the
// same head.
func without(free, taken []int) []int {
	if len(taken) <= len(free) && (len(taken) == 0 || free[0] == taken[0] && free[len(taken)-1] == taken[len(taken)-1]) {
		return free[len(taken):]
	}
	out := make([]int, 0, len(free))
	j := 0
	for _, u := range free {
		if j < len(taken) && u == taken[j] {
			j++
			continue
		}
		out = append(out, u)
	}
	return out
}
