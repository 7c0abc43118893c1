package placement

import "math"

// FragFloor is a floor under the frag policy's figure (Candidate.Frag) of
// any choice e could make for r on n: what a cluster needs to leave out,
// without asking their engine, the nodes whose answer cannot come before
// the answers it already has. It is read from the node's state before the
// request, kept in memo (nil: none kept) as Rank keeps it. +Inf when no
// usable GPU of n has r.Units free; 0 under the other policies and without
// a mix, where every choice's figure is 0.
//
// For a fractional request that leaves the host enough for every shape of
// the mix it is FragLeast, kept in memo by r's units: a cluster asks for
// the floors of every node it holds, request after request, and those
// depend on nothing else of the request. Otherwise each shape's part of the
// figure is bounded on its own, over every GPU with room for r, whatever
// else filters them (filters only take choices away), in a step per shape:
// a floor for a request of whole GPUs, a cheap one for a fractional request
// that leaves the host short. The host's part is the same for every choice
// of one request, so a request of no GPU's floor is its figure.
func (e *Engine) FragFloor(n *Node, r Request, memo *Memo) float64 {
	return e.fragFloor(n, r, memo, false)
}

// FragLeast is the least figure any choice of one GPU could have for a
// fractional r on n: each GPU with room for r is scored as a decision
// scores it, without the filters, instances or order that decide among
// them. It is a floor as FragFloor is, never lower than it, and costs a
// step per shape for each GPU unless memo keeps it; for a request of whole
// GPUs or of no GPU it is FragFloor.
func (e *Engine) FragLeast(n *Node, r Request, memo *Memo) float64 {
	return e.fragFloor(n, r, memo, true)
}

func (e *Engine) fragFloor(n *Node, r Request, memo *Memo, tight bool) float64 {
	if e.policy != Frag || e.mix == nil {
		return 0
	}
	key := floorKey(r)
	if memo != nil && memo.floors.n == n && memo.floors.mix == e.mix && memo.floors.roomy(r) {
		if key == 0 {
			// A request of no GPU that leaves every shape its host
			// part leaves every shape its part: the figure is 0.
			return 0
		}
		if floor, ok := memo.floors.find(key); ok {
			return floor
		}
	}
	fs := memo.fragScorer(n, e.mix)
	roomy := !fs.short(r)
	var floor float64
	switch {
	case r.GPUs > 0:
		var ok bool
		if floor, ok = e.wholeFigure(fs, r, memo); !ok {
			floor = roundScore(fs.wholeFloor(r) - floorMargin)
		}
	case r.Units > 0 && (tight || roomy):
		floor = fs.least(r)
	case r.Units > 0:
		floor = roundScore(fs.unitsFloor(r) - floorMargin)
	case !roomy:
		// Exact: the host's part is the same for every choice.
		floor = roundScore(fs.delta(r, -1, 0))
	}
	if memo != nil {
		memo.floors.keep(fs, key, floor, roomy)
	}
	return floor
}

// least is the least figure of a choice of one GPU with room for r.
func (fs *fragScorer) least(r Request) float64 {
	out := math.Inf(1)
	for gi, f := range fs.base.free {
		if f >= r.Units {
			out = min(out, roundScore(fs.delta(r, gi, r.Units)))
		}
	}
	return out
}

// floorMargin is what FragFloor takes off its sums, which add the shapes'
// parts in another order than a decision's figure does, so that a floor
// that equals a figure is not above it by float rounding: far above the
// rounding of either, far below scoreResolution.
const floorMargin = 1e-7

// floorMemo keeps the floors of the requests that leave the host of a
// node enough for every shape of the mix: those depend on nothing of the
// request but its units or GPUs (floorKey), of which a cluster sees few.
type floorMemo struct {
	// n and mix are what the floors were read for; nil: none kept.
	n                     *Node
	mix                   *Mix
	spareCPU, spareMemory int64
	align                 alignFigures
	kept                  [floorSlots]keptFloor
}

// floorSlots is how many floors a memo keeps: a key's floor is in one of
// two slots its hash picks.
const floorSlots = 16

type keptFloor struct {
	key   int
	floor float64
}

// floorKey is what a floor depends on of a request that leaves the host
// enough: its units, or minus its GPUs; 0 for a request of no GPU.
func floorKey(r Request) int {
	if r.GPUs > 0 {
		return -r.GPUs
	}
	return max(r.Units, 0)
}

// roomy says whether r leaves the host enough for every shape.
func (m *floorMemo) roomy(r Request) bool {
	return int64(r.HostCPUMilli) <= m.spareCPU && int64(r.HostMemoryMiB) <= m.spareMemory
}

// keep keeps floor as the one of key, when roomy, for the node fs scores.
func (m *floorMemo) keep(fs *fragScorer, key int, floor float64, roomy bool) {
	if m.n != fs.n || m.mix != fs.mix {
		*m = floorMemo{n: fs.n, mix: fs.mix, spareCPU: math.MaxInt64, spareMemory: math.MaxInt64, align: fs.align}
		if fs.hasHost {
			m.spareCPU, m.spareMemory = fs.room.spareCPU, fs.room.spareMemory
		}
	}
	if roomy && key != 0 {
		// The older of the two gives way.
		pair := m.kept[floorSlot(key):]
		pair[1], pair[0] = pair[0], keptFloor{key: key, floor: floor}
	}
}

// find is the floor kept for key.
func (m *floorMemo) find(key int) (float64, bool) {
	pair := m.kept[floorSlot(key):]
	switch key {
	case pair[0].key:
		return pair[0].floor, true
	case pair[1].key:
		return pair[1].floor, true
	}
	return 0, false
}

// floorSlot is the first of key's two slots: the keys are units, often
// multiples of ten, which a multiplicative hash spreads.
func floorSlot(key int) int {
	return int(uint64(key)*0x9e3779b97f4a7c15>>61) * 2
}

// unitsFloor is the floor for a fractional request: a choice of a GPU with
// f free changes a shape of u' units (on a GPU of its type) by -u when the
// GPU had fewer than u' free, by f-u when it is left with fewer, else by 0;
// and a shape of whole GPUs by -u unless the GPU was one of the whole it
// needs. The GPUs with the fewest free (least) are bounded on their own,
// the others together (their fewest free: next); so are the shapes, which
// is why it is a floor and not the figure. It reads the node's state
// before the request only as fs.base.free and fs.room, unless r leaves the
// host short for some shape.
func (fs *fragScorer) unitsFloor(r Request) float64 {
	u := r.Units
	if fs.room.most < u {
		return math.Inf(1)
	}
	least, next := fs.room.most, math.MaxInt // the two fewest free of the GPUs with room
	for _, f := range fs.base.free {
		switch {
		case f < u || f == least:
		case f < least:
			least, next = f, least
		case f < next:
			next = f
		}
	}
	partial := fs.room.mostPartial >= u // some GPU with room is not whole
	total := fs.total - u
	cpu, mem := fs.hostAfter(r)
	short := fs.short(r)
	var atLeast, atNext float64
	for i := range fs.mix.Shapes {
		sh := &fs.mix.Shapes[i]
		var change, nextChange int
		switch {
		case short && sh.hostCannot(cpu, mem):
			change = total - fs.lostBefore(i)
			nextChange = change
		case sh.Restricted():
			// A GPU of another type may be chosen: its units were lost
			// to the shape and stay lost.
			change, nextChange = -u, -u
		case sh.GPUs > 0:
			change = -u
			if !partial && fs.room.whole >= sh.GPUs {
				// Every GPU with room is whole: one stops being,
				// and is left with its units less u, or the shape
				// loses every unit when too few stay whole; it lost
				// those of the GPUs not whole before.
				change = least - u
				if fs.room.whole-1 < sh.GPUs {
					change = total - (fs.total - fs.room.wholeFree)
				}
			}
			nextChange = change
		case sh.Units > 0:
			change = unitsChange(least, least, u, sh.Units)
			nextChange = unitsChange(next, fs.room.most, u, sh.Units)
		}
		atLeast += sh.Weight * float64(change)
		atNext += sh.Weight * float64(nextChange)
	}
	if next == math.MaxInt {
		return atLeast
	}
	return min(atLeast, atNext)
}

// unitsChange is the least a choice of a GPU with between fewest and most
// free changes the part of a shape of s units on a GPU of its type: -u if
// the GPU could not take the shape, 0 if it still can, else what is left.
func unitsChange(fewest, most, u, s int) int {
	switch {
	case fewest < s:
		return -u
	case most-u >= s:
		return 0
	}
	return fewest - u
}

// lostBefore is what the mix's shape i cannot use of the node before the
// request.
func (fs *fragScorer) lostBefore(i int) int {
	return fs.lost(&fs.mix.Shapes[i], fs.shapes[i].gpuLost, fs.total, fs.base.cpuFree, fs.base.memFree)
}

// wholeFloor is the floor for a request of whole GPUs: the GPUs it takes
// were whole, so a shape of units no larger than any GPU lost none of them
// and loses none, and a shape of whole GPUs of any model that had enough
// whole GPUs lost none of them and loses none or more (all that is left,
// when too few stay whole); any other shape loses at most what is taken.
func (fs *fragScorer) wholeFloor(r Request) float64 {
	fewest, most := 0, 0
	for gi := range fs.n.GPUs {
		units := fs.n.GPUs[gi].Units
		if gi == 0 || units < fewest {
			fewest = units
		}
		most = max(most, units)
	}
	taken := r.GPUs * most
	cpu, mem := fs.hostAfter(r)
	var out float64
	for i := range fs.mix.Shapes {
		sh := &fs.mix.Shapes[i]
		change := -taken
		switch {
		case fs.hasHost && sh.hostCannot(cpu, mem):
			change = fs.total - taken - fs.lostBefore(i)
		case !sh.Restricted() && sh.GPUs == 0 && sh.Units <= fewest:
			change = 0
		case !sh.Restricted() && sh.GPUs > 0 && fs.shapes[i].whole >= sh.GPUs:
			change = 0
		}
		out += sh.Weight * float64(change)
	}
	return out
}

// wholeFigure is the figure of every choice of r.GPUs whole GPUs of fs's
// node, when they all have the same: no shape of the mix tells GPUs apart
// by model or type, and every GPU has as many units, so that each shape
// loses as many units whichever GPUs go. Worked out as a decision works
// out its figure (wholeDelta), it is that figure to the bit, and so is a
// floor with no margin: a cluster whose nodes tie at it stops at the first
// answer instead of asking every node of the tie. False when the choices
// may differ, or too few GPUs are whole.
func (e *Engine) wholeFigure(fs *fragScorer, r Request, memo *Memo) (float64, bool) {
	if fs.mix.openRow() == nil {
		return 0, false
	}
	gpus := fs.n.GPUs
	var buf [maxStackGPUs]int
	chosen := buf[:0]
	for gi := range gpus {
		if gpus[gi].Units != gpus[0].Units {
			return 0, false
		}
		if fs.base.free[gi] == gpus[gi].Units && len(chosen) < r.GPUs {
			chosen = append(chosen, gi)
		}
	}
	if len(chosen) < r.GPUs {
		return 0, false
	}
	return roundScore(e.wholeDelta(fs.n, r, chosen, memo)), true
}

// short says whether r leaves the host too little for some shape of the
// mix.
func (fs *fragScorer) short(r Request) bool {
	return fs.hasHost && (int64(r.HostCPUMilli) > fs.room.spareCPU || int64(r.HostMemoryMiB) > fs.room.spareMemory)
}

// Align is HostAlign(n, r), read from what memo keeps of n (nil: nothing
// kept), for a cluster that orders by it nodes it has not asked.
func (e *Engine) Align(n *Node, r Request, memo *Memo) float64 {
	if memo != nil && memo.floors.n == n && memo.floors.mix == e.mix {
		return memo.floors.align.of(r)
	}
	return memo.fragScorer(n, e.mix).align.of(r)
}

// hostAfter is the host's free CPU and memory once r has its part.
func (fs *fragScorer) hostAfter(r Request) (cpu, mem uint64) {
	cpu, mem = fs.base.cpuFree, fs.base.memFree
	if fs.hasHost {
		cpu -= min(cpu, r.HostCPUMilli)
		mem -= min(mem, r.HostMemoryMiB)
	}
	return cpu, mem
}
