package placement

import (
	"math"
	"sync"
)

// The frag policy (the idea of FGD, "Beware of Fragmentation", USENIX ATC
// '23): a node's fragmentation for one kind of request is the free units that
// kind cannot use (on GPUs of another model, in holes smaller than it asks,
// on GPUs not whole for a whole-GPU request, or all of them when the host
// lacks the CPU or memory it asks); the expected fragmentation is that, weighed
// over the recent request mix. Among the choices that fit, the one that
// raises the expected fragmentation of its node the least wins; ties go as
// best-fit. docs/placement.md has a worked example that frag_test.go checks.

// Shape is one kind of request of a mix.
type Shape struct {
	// Units is a fractional request's units of one GPU; 0 for a whole-GPU
	// request (GPUs) or one that asks no GPU.
	Units int
	GPUs  int
	Type  string
	// Models are the GPU models the shape accepts, any of them, joined by
	// "|" in order (a cluster's request lists them); empty: any.
	Models string
	// HostCPUMilli and HostMemoryMiB are what the request asks of the host.
	HostCPUMilli, HostMemoryMiB uint64
	// Weight is the shape's share of the mix.
	Weight float64
}

// Mix is the recent request mix the frag policy weighs fragmentation over.
// It is made by a Learner and never changed after: decisions read it.
type Mix struct {
	Shapes []Shape
	// mu guards accepts: per GPU name, whether each shape accepts it
	// (accepting).
	mu      sync.Mutex
	accepts map[string][]bool
	// open is the row of every GPU when no shape is restricted
	// (Shape.Restricted), else nil; read once.
	open     []bool
	openOnce sync.Once
}

// Mix is the mix e's frag policy weighs over; nil: none.
func (e *Engine) Mix() *Mix { return e.mix }

// WithMix returns a copy of e whose frag policy weighs fragmentation over m
// (nil: no mix, every choice scores 0 and best-fit decides); e itself is not
// changed, since decisions may be using it.
func (e *Engine) WithMix(m *Mix) *Engine {
	c := *e
	c.mix = m
	return &c
}

// fragState is a node's free resources as the frag policy counts them: each
// GPU's free units (0 for a GPU that takes nothing now) and the host's free
// CPU and memory. A candidate is scored by changing a copy of it.
type fragState struct {
	free             []int
	cpuFree, memFree uint64
}

// maxStackGPUs is the GPUs a node may have for its frag state to live on
// the stack; larger nodes allocate.
const maxStackGPUs = 16

// newFragState reads n's state into buf.
func newFragState(n *Node, buf []int) fragState {
	s := fragState{free: buf[:0]}
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		f := g.Free
		if g.Unusable != "" {
			f = 0
		}
		s.free = append(s.free, f)
	}
	if n.Host != nil {
		s.cpuFree, s.memFree = n.Host.CPUMilliFree, n.Host.MemoryMiBFree
	}
	return s
}

// Fragmentation is the expected fragmentation of n under m, in units: the
// free units that the mix's requests, weighed by their share, cannot use.
// Nil m: 0.
func Fragmentation(n *Node, m *Mix) float64 {
	if m == nil {
		return 0
	}
	var buf [maxStackGPUs]int
	var rows [maxStackGPUs][]bool
	return fragmentation(n, m, newFragState(n, buf[:]), acceptRows(n, m, rows[:0]))
}

// acceptRows appends to buf, for each GPU of n, whether each shape of m
// accepts it (Mix.accepting).
func acceptRows(n *Node, m *Mix, buf [][]bool) [][]bool {
	open := m.openRow()
	for gi := range n.GPUs {
		row := open
		if row == nil {
			row = m.accepting(n.GPUs[gi].Name)
		}
		buf = append(buf, row)
	}
	return buf
}

// fragmentation is the expected fragmentation of n in state s under m: the
// weighed sum, over the mix's shapes, of the free units each cannot use;
// accept is acceptRows(n, m).
func fragmentation(n *Node, m *Mix, s fragState, accept [][]bool) float64 {
	total := 0
	for _, f := range s.free {
		total += f
	}
	out := 0.0
	for i := range m.Shapes {
		out += m.Shapes[i].Weight * float64(unusableFor(n, m, i, accept, s, total))
	}
	return out
}

// unusableFor is the free units of n (in state s, total free) that shape i
// of m cannot use; accept is acceptRows(n, m).
func unusableFor(n *Node, m *Mix, i int, accept [][]bool, s fragState, total int) int {
	sh := &m.Shapes[i]
	if n.Host != nil && (sh.HostCPUMilli > s.cpuFree || sh.HostMemoryMiB > s.memFree) {
		return total
	}
	switch {
	case sh.GPUs > 0:
		whole, partial := 0, 0
		for gi := range n.GPUs {
			g := &n.GPUs[gi]
			switch {
			case !accept[gi][i]:
				partial += s.free[gi]
			case s.free[gi] == g.Units:
				whole++
			default:
				partial += s.free[gi]
			}
		}
		if whole < sh.GPUs {
			return total
		}
		return partial
	case sh.Units > 0:
		lost := 0
		for gi := range n.GPUs {
			if f := s.free[gi]; f < sh.Units || !accept[gi][i] {
				lost += f
			}
		}
		return lost
	}
	return 0
}

// fragScorer scores the choices of one decision under the frag policy: the
// node's expected fragmentation before, read once with each shape's part of
// it, so that a choice that changes one GPU is scored in a step per shape
// (delta), not a pass over the GPUs per shape.
type fragScorer struct {
	// What FragFloor reads of a node that leaves the host short comes
	// first, and nothing of the node but it.
	n       *Node
	mix     *Mix
	hasHost bool
	total   int
	room    gpuRoom
	base    fragState
	buf     [maxStackGPUs]int
	before  float64
	shapes  []shapeBefore
	// accept is, per GPU, whether each shape of the mix accepts it.
	accept [][]bool
	align  alignFigures
}

// gpuRoom is what a floor needs of a node's GPUs besides each one's free
// units: the whole GPUs and their free units, the most free of one GPU and
// of one GPU not whole, and the host's CPU and memory a request may take
// with every shape of the mix still able to have its own (negative: some
// shape cannot already).
type gpuRoom struct {
	whole, wholeFree      int
	most, mostPartial     int
	spareCPU, spareMemory int64
}

// shapeBefore is one shape's view of the node before the choice: its GPU
// part (the free units it cannot use when the host can take it), and for a
// whole-GPU shape the whole GPUs of its type and the free units of the
// others.
type shapeBefore struct {
	gpuLost        int
	whole, partial int
}

// Memo keeps what a decision on one node learnt of the node before the
// request, and the floors read of it (Engine.FragFloor), for the next
// decision or floor on the same node under the same engine. Its zero value
// is empty; a nil Memo keeps nothing.
type Memo struct {
	frag *fragScorer
	// floors is kept in m itself, not behind a pointer: a cluster reads
	// the floor of every node it holds for each request.
	floors floorMemo
}

// Reset empties m: its node changed, or another engine decides.
func (m *Memo) Reset() {
	if m != nil {
		*m = Memo{}
	}
}

// fragScorer is the frag policy's view of n under mix, the one kept in m
// when it is there.
func (m *Memo) fragScorer(n *Node, mix *Mix) *fragScorer {
	if m == nil {
		return newFragScorer(n, mix)
	}
	if m.frag == nil || m.frag.n != n || m.frag.mix != mix {
		m.frag = newFragScorer(n, mix)
	}
	return m.frag
}

func newFragScorer(n *Node, m *Mix) *fragScorer {
	fs := &fragScorer{n: n, mix: m, hasHost: n.Host != nil, align: readAlign(n)}
	if m == nil {
		return fs
	}
	fs.base = newFragState(n, fs.buf[:])
	fs.room = gpuRoom{mostPartial: -1}
	for gi, f := range fs.base.free {
		fs.total += f
		fs.room.most = max(fs.room.most, f)
		if f == n.GPUs[gi].Units {
			fs.room.whole++
			fs.room.wholeFree += f
		} else {
			fs.room.mostPartial = max(fs.room.mostPartial, f)
		}
	}
	fs.room.spareCPU, fs.room.spareMemory = int64(fs.base.cpuFree), int64(fs.base.memFree)
	for i := range m.Shapes {
		fs.room.spareCPU = min(fs.room.spareCPU, int64(fs.base.cpuFree)-int64(m.Shapes[i].HostCPUMilli))
		fs.room.spareMemory = min(fs.room.spareMemory, int64(fs.base.memFree)-int64(m.Shapes[i].HostMemoryMiB))
	}
	fs.shapes = make([]shapeBefore, len(m.Shapes))
	fs.accept = acceptRows(n, m, make([][]bool, 0, len(n.GPUs)))
	for i := range m.Shapes {
		sh := &m.Shapes[i]
		b := &fs.shapes[i]
		for gi := range n.GPUs {
			f := fs.base.free[gi]
			switch {
			case sh.GPUs > 0:
				if f == n.GPUs[gi].Units && fs.accept[gi][i] {
					b.whole++
				} else {
					b.partial += f
				}
			case sh.Units > 0:
				if f < sh.Units || !fs.accept[gi][i] {
					b.gpuLost += f
				}
			}
		}
		if sh.GPUs > 0 {
			b.gpuLost = b.partial
			if b.whole < sh.GPUs {
				b.gpuLost = fs.total
			}
		}
		fs.before += sh.Weight * float64(fs.lost(sh, b.gpuLost, fs.total, fs.base.cpuFree, fs.base.memFree))
	}
	return fs
}

// lost is what shape sh cannot use of a node whose GPU part for it is
// gpuLost, total free, and host free cpu and mem.
func (fs *fragScorer) lost(sh *Shape, gpuLost, total int, cpu, mem uint64) int {
	if fs.n.Host != nil && sh.hostCannot(cpu, mem) {
		return total
	}
	return gpuLost
}

// hostCannot says whether a host with cpu and mem free cannot take sh's
// host part: then none of the node's GPU is usable to sh.
func (sh *Shape) hostCannot(cpu, mem uint64) bool {
	return sh.HostCPUMilli > cpu || sh.HostMemoryMiB > mem
}

// delta is how much taking units of GPU gi (a position in n.GPUs; -1: no
// GPU) and r's host resources raises the node's expected fragmentation: per
// shape, the GPU's part before is taken out and its part after put in.
func (fs *fragScorer) delta(r Request, gi, units int) float64 {
	if fs.mix == nil {
		return 0
	}
	cpu, mem := fs.base.cpuFree, fs.base.memFree
	if fs.n.Host != nil {
		cpu -= min(cpu, r.HostCPUMilli)
		mem -= min(mem, r.HostMemoryMiB)
	}
	if gi < 0 {
		after := 0.0
		for i := range fs.mix.Shapes {
			after += fs.mix.Shapes[i].Weight * float64(fs.lost(&fs.mix.Shapes[i], fs.shapes[i].gpuLost, fs.total, cpu, mem))
		}
		return after - fs.before
	}
	g := &fs.n.GPUs[gi]
	f := fs.base.free[gi]
	after, total := 0.0, fs.total-units
	for i := range fs.mix.Shapes {
		sh := &fs.mix.Shapes[i]
		b := &fs.shapes[i]
		gpuLost := b.gpuLost
		switch {
		case sh.GPUs > 0:
			whole, partial := b.whole, b.partial
			if f == g.Units && fs.accept[gi][i] {
				// A whole GPU no longer whole: its units left count
				// among the others'.
				whole--
				partial += f - units
			} else {
				partial -= units
			}
			gpuLost = partial
			if whole < sh.GPUs {
				gpuLost = total
			}
		case sh.Units > 0:
			match := fs.accept[gi][i]
			if f < sh.Units || !match {
				gpuLost -= f
			}
			if f-units < sh.Units || !match {
				gpuLost += f - units
			}
		}
		after += sh.Weight * float64(fs.lost(sh, gpuLost, total, cpu, mem))
	}
	return after - fs.before
}

// HostAlign orders nodes whose fragmentation r changes alike, higher
// first. For a request of GPU it is the cosine similarity of what r asks of
// n and what n has free, as shares of the node's totals: (host CPU, GPU
// units); a request heavy on CPU goes where CPU is plentiful, not where it
// would leave GPUs that no request has the CPU left to use. It is rounded
// to a 1/alignSteps, so that nodes whose shapes differ by less tie and the
// fuller node wins, as under best-fit: an empty node, shaped as a request
// that asks CPU and GPU in its proportion, does not win over a node in use
// shaped nearly as well, and nodes left whole stay whole for requests of
// many GPUs. For a request of no GPU it is the CPU the node
// has left after r against its free GPU, cpu left ÷ (cpu left + GPU free),
// in milli-CPU and milli-GPU: the request goes where the most CPU is left
// per free GPU (1 where no GPU is free: it strands none), so that it takes
// CPU where CPU is plentiful for the GPU left, not from a node whose GPUs
// will need it (a node of 104 cores and two free GPUs before one of 96
// cores and eight). 0 when n has no Host.
func HostAlign(n *Node, r Request) float64 {
	a := readAlign(n)
	return a.of(r)
}

// alignFigures is what HostAlign reads of a node, so that a scorer kept in
// a Memo answers it without reading the node again.
type alignFigures struct {
	// ok is false when n has no Host, no CPU or no units: Align is 0.
	ok                bool
	cpu, cpuFree      uint64
	units, free, unit int
}

func readAlign(n *Node) alignFigures {
	h := n.Host
	if h == nil || h.CPUMilli == 0 {
		return alignFigures{}
	}
	a := alignFigures{cpu: h.CPUMilli, cpuFree: h.CPUMilliFree}
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		a.units += g.Units
		if g.Unusable == "" {
			a.free += g.Free
		}
	}
	if len(n.GPUs) > 0 {
		a.unit = n.GPUs[0].Units
	}
	a.ok = a.units > 0
	return a
}

// of is HostAlign of the node a was read from and r.
func (a *alignFigures) of(r Request) float64 {
	if !a.ok {
		return 0
	}
	asked := r.Units
	if r.GPUs > 0 {
		asked = r.GPUs * a.unit
	}
	if asked == 0 {
		if a.cpuFree == 0 {
			return 0
		}
		gpu := float64(a.free) * 1000 / float64(max(a.unit, 1))
		if gpu == 0 {
			return 1
		}
		left := float64(a.cpuFree - min(a.cpuFree, r.HostCPUMilli))
		return roundScore(left / (left + gpu))
	}
	x := [2]float64{float64(r.HostCPUMilli) / float64(a.cpu), float64(asked) / float64(a.units)}
	f := [2]float64{float64(a.cpuFree) / float64(a.cpu), float64(a.free) / float64(a.units)}
	return math.Round(roundScore(cosine(x, f))*alignSteps) / alignSteps
}

// alignSteps is how finely HostAlign tells the shapes of requests of GPU
// apart: it is rounded to a 1/alignSteps, so that nodes shaped nearly
// alike tie and best-fit orders them (docs/replay.md has the steps
// measured).
const alignSteps = 32
