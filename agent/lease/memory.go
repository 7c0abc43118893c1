package lease

import "github.com/gpulet/gpulet/pipefile"

// The GPU memory the table holds (docs/design.md §1.8). A lease's
// memory is held from its grant to its end, whether its processes use it
// yet or not: with MPS it is the lease's pinned memory limit (EnvFor), and a
// job that starts late must still find it. What each holds:
//
//   - a lease of units: the memory_mib it asked for, else its units' share
//     of the GPU's memory (total × units / units per GPU, rounded down);
//   - a lease of whole GPUs: all of each GPU's memory;
//   - a unit claimed offline, or set aside for a reservation and not in
//     use: one unit's share (its claimer's limit, layout.json's).
//
// Placement sees as free the GPU's memory less what is held and less what
// processes beside gpulet use, as accounting found them; without
// accounting, the least of the memory not held and the memory last measured
// free (memoryFreeMiB).

// heldMiB is the memory lease l holds on one of its GPUs, of total MiB cut
// into unitsPerGPU units.
func (l *lease) heldMiB(unitsPerGPU int, total uint64) uint64 {
	switch {
	case l.whole:
		return total
	case l.memMiB > 0:
		return l.memMiB
	}
	return pipefile.MemoryShareMiB(l.units, unitsPerGPU, total)
}

// unitsHeldMiB is the memory n units claimed offline or set aside hold.
func unitsHeldMiB(n, unitsPerGPU int, total uint64) uint64 {
	if n <= 0 {
		return 0
	}
	return pipefile.MemoryShareMiB(n, unitsPerGPU, total)
}

// memoryFreeMiB is the free memory placement sees on GPU g under conditions
// gc (nil: none yet), were lessHeld MiB of what it holds let go: units set
// aside for a reservation hold memory that the reservation's own draws may
// use.
func memoryFreeMiB(g *gpuTable, gc *GPUCondition, lessHeld uint64) uint64 {
	held := g.view.HeldMemoryMiB
	held -= min(held, lessHeld)
	return heldFreeMiB(g.dev.MemoryTotalMiB, held, gc)
}

// heldFreeMiB is the free memory placement sees on a GPU of total MiB that
// holds held, under conditions gc (nil: none yet). Memory that processes
// beside gpulet use is held by nothing and not free either. Accounting
// tells them apart from the leases' processes, whose memory is held
// already; without it, the memory last measured free bounds what is free.
// That measure lags: units let go read as used until the next sample.
func heldFreeMiB(total, held uint64, gc *GPUCondition) uint64 {
	taken := held
	if gc != nil && gc.Accounted {
		taken += gc.OutsideMiB
	}
	free := total - min(total, taken)
	if gc != nil && !gc.Accounted {
		free = min(free, gc.MemoryFreeMiB)
	}
	return free
}
