package placement

import (
	"fmt"
	"math"
	"testing"
)

// fragNode is GPUs of 1000 units, one instance each, with free units free
// (the worked example of docs/placement.md, "--policy frag").
func fragNode(free ...int) *Node {
	n := &Node{ClientsPerInstance: 1000}
	for gi, f := range free {
		g := GPU{Index: gi, Name: "Tesla T4", MemoryTotalMiB: 15360, MemoryFreeMiB: 15360, Free: f, Units: 1000}
		in := Instance{Index: 0, Size: 1000}
		for u := 1000 - f; u < 1000; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		g.Instances = []Instance{in}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

// The worked example: GPU 0 has 400 units free, GPU 1 600, and the node has
// seen as many requests of 200 units as of 400. Best-fit puts a request of
// 200 on GPU 0, leaving 200 there, a hole no request of 400 can use; frag
// puts it on GPU 1, leaving 400 on each, which both kinds can use.
func TestFragWorkedExample(t *testing.T) {
	mix := &Mix{Shapes: []Shape{{Units: 200, Weight: 0.5}, {Units: 400, Weight: 0.5}}}
	for _, tc := range []struct {
		name  string
		free  []int
		units int
		// frag is the expected fragmentation of the node as it is, and
		// after[i] after the request goes to GPU i.
		frag  float64
		after []float64
		want  int
		best  int // what best-fit takes
	}{
		{name: "200 units", free: []int{400, 600}, units: 200, frag: 0, after: []float64{100, 0}, want: 1, best: 0},
		{name: "400 units", free: []int{400, 600}, units: 400, frag: 0, after: []float64{0, 100}, want: 0, best: 0},
		{name: "filling a hole too small for 400", free: []int{300, 600}, units: 200, frag: 150, after: []float64{100, 150}, want: 0, best: 0},
		{name: "a tie goes as best-fit", free: []int{100, 150}, units: 100, frag: 250, after: []float64{150, 150}, want: 0, best: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := fragNode(tc.free...)
			var buf [maxStackGPUs]int
			if got := fragmentation(n, mix, newFragState(n, buf[:]), acceptRows(n, mix, nil)); got != tc.frag {
				t.Errorf("fragmentation = %v, want %v", got, tc.frag)
			}
			fs := newFragScorer(n, mix)
			if fs.before != tc.frag {
				t.Errorf("the scorer's fragmentation before = %v, want %v", fs.before, tc.frag)
			}
			for gi, want := range tc.after {
				if got := fs.before + fs.delta(Request{Units: tc.units}, gi, tc.units); got != want {
					t.Errorf("after GPU %d: %v, want %v", gi, got, want)
				}
			}
			d, err := New(Frag).WithMix(mix).Place(n, Request{Units: tc.units})
			if err != nil || d.Choice.GPU != tc.want || d.Best.Frag != tc.after[tc.want]-tc.frag {
				t.Errorf("frag chose %+v (frag %v), %v; want GPU %d", d.Choice, d.Best.Frag, err, tc.want)
			}
			if d, _ := New(BestFit).Place(n, Request{Units: tc.units}); d.Choice.GPU != tc.best {
				t.Errorf("best-fit chose GPU %d, want %d", d.Choice.GPU, tc.best)
			}
		})
	}
}

func TestFragShapes(t *testing.T) {
	n := fragNode(1000, 1000, 500, 0)
	n.GPUs[1].Name = "NVIDIA A10"
	n.Host = &Host{CPUMilli: 8000, MemoryMiB: 8192, CPUMilliFree: 4000, MemoryMiBFree: 8192}
	var buf [maxStackGPUs]int
	s := newFragState(n, buf[:])
	for _, tc := range []struct {
		shape Shape
		lost  int
	}{
		{Shape{Units: 600}, 500},
		{Shape{Units: 600, Type: "T4"}, 1500},
		{Shape{GPUs: 1}, 500},
		{Shape{GPUs: 2}, 500},
		{Shape{GPUs: 2, Type: "T4"}, 2500},
		{Shape{GPUs: 3}, 2500},
		{Shape{Units: 100, HostCPUMilli: 5000}, 2500},
		{Shape{HostCPUMilli: 100}, 0},
	} {
		mix := &Mix{Shapes: []Shape{tc.shape}}
		if got := unusableFor(n, mix, 0, acceptRows(n, mix, nil), s, 2500); got != tc.lost {
			t.Errorf("%+v cannot use %d units, want %d", tc.shape, got, tc.lost)
		}
	}
	// A failed GPU has nothing free to lose.
	n.GPUs[2].Unusable = "has failed"
	if got := Fragmentation(n, &Mix{Shapes: []Shape{{Units: 600, Weight: 1}}}); got != 0 {
		t.Errorf("with GPU 2 failed: %v, want 0", got)
	}
}

func TestFragWithoutMixIsBestFit(t *testing.T) {
	n := fragNode(400, 600)
	d, err := New(Frag).Place(n, Request{Units: 200})
	if err != nil || d.Choice.GPU != 0 || d.Best.Frag != 0 {
		t.Fatalf("got %+v, %v; want GPU 0 as best-fit", d.Choice, err)
	}
}

func TestLearner(t *testing.T) {
	l := NewLearner(100, 2, 1)
	if l.Mix() != nil {
		t.Fatal("a mix before any request")
	}
	// A request of no GPU is not counted.
	l.Observe(Request{HostCPUMilli: 8000, HostMemoryMiB: 100})
	if m := l.Mix(); m != nil {
		t.Fatalf("a mix of a request of no GPU: %+v", m.Shapes)
	}
	for i := 0; i < 30; i++ {
		l.Observe(Request{Units: 200})
		if i%3 == 0 {
			l.Observe(Request{Units: 400})
			l.Observe(Request{HostCPUMilli: 8000})
		}
	}
	l.Observe(Request{GPUs: 2, Units: 7})
	m := l.Mix()
	if len(m.Shapes) != 2 || m.Shapes[0].Units != 200 || m.Shapes[1].Units != 400 {
		t.Fatalf("mix %+v: want the two most frequent, 200 then 400", m.Shapes)
	}
	if got := fmt.Sprintf("%.4f %.4f", m.Shapes[0].Weight, m.Shapes[1].Weight); got != "0.7317 0.2439" {
		t.Errorf("weights %s, want 30/41 and 10/41", got)
	}
	// Past the window, older requests fade: a new kind takes over.
	for i := 0; i < 400; i++ {
		l.Observe(Request{Units: 700})
	}
	if m := l.Mix(); m.Shapes[0].Units != 700 || m.Shapes[0].Weight < 0.9 {
		t.Errorf("after 400 requests of 700 units: %+v", m.Shapes)
	}
	if s := ShapeOf(Request{GPUs: 2, Units: 7}); s.Units != 0 || s.GPUs != 2 {
		t.Errorf("a whole-GPU shape keeps units: %+v", s)
	}
}

func TestHostAlign(t *testing.T) {
	n := fragNode(1000, 1000)
	n.Host = &Host{CPUMilli: 100000, MemoryMiB: 1 << 20, CPUMilliFree: 100000, MemoryMiBFree: 1 << 20}
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		// Free: (1, 1). A request asking CPU and GPU in the node's
		// proportion points the same way.
		{"as shaped as the node", Request{Units: 500, HostCPUMilli: 25000}, "1.0000"},
		// The cosine is 0.7071, rounded to 23/32.
		{"GPU only", Request{Units: 500}, "0.7188"},
		// No GPU: 99,000 milli-CPU left against 2,000 milli-GPU free.
		{"CPU only", Request{HostCPUMilli: 1000}, "0.9802"},
		{"whole GPUs count all their units", Request{GPUs: 2, HostCPUMilli: 100000}, "1.0000"},
	} {
		if got := fmt.Sprintf("%.4f", HostAlign(n, tc.req)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	n.Host = nil
	if got := HostAlign(n, Request{Units: 1}); got != 0 {
		t.Errorf("without a host: %v, want 0", got)
	}
}

// A request of no GPU goes where the most CPU is left per free GPU: to a
// node of 104 cores and two free GPUs, a quarter of its CPU taken, before
// an empty one of 96 cores and eight, whose GPUs will need their CPU, and
// before either to a node with no GPU free.
func TestHostAlignOfNoGPU(t *testing.T) {
	r := Request{HostCPUMilli: 12000}
	twoOf104 := fragNode(1000, 1000)
	twoOf104.Host = &Host{CPUMilli: 104000, CPUMilliFree: 78000}
	eightOf96 := fragNode(1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	eightOf96.Host = &Host{CPUMilli: 96000, CPUMilliFree: 96000}
	full := fragNode(0, 0)
	full.Host = &Host{CPUMilli: 16000, CPUMilliFree: 12000}
	a, b, c := HostAlign(twoOf104, r), HostAlign(eightOf96, r), HostAlign(full, r)
	if !(c > a && a > b) {
		t.Errorf("12 cores, no GPU: %v on 104 cores with 2 GPUs free, %v on 96 cores with 8, %v with none free; want the last first, then the first", a, b, c)
	}
	if c != 1 {
		t.Errorf("no GPU free: %v, want 1", c)
	}
}

// Nodes whose free CPU and GPU are shaped within half a step of each other
// tie, so that the fuller wins as under best-fit; further apart, the
// closer shape wins.
func TestHostAlignSteps(t *testing.T) {
	r := Request{Units: 1000, HostCPUMilli: 12000}
	at := func(cpuFree uint64, free ...int) float64 {
		n := fragNode(free...)
		n.Host = &Host{CPUMilli: 96000, CPUMilliFree: cpuFree}
		return HostAlign(n, r)
	}
	// Shaped as the request: cosine 1.
	empty := at(96000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	// Two GPUs and 20 of 96 cores taken: cosine 0.9996; four GPUs and
	// 40 cores: 0.9970. All three round to 1.
	two := at(76000, 1000, 1000, 1000, 1000, 1000, 1000, 0, 0)
	four := at(56000, 1000, 1000, 1000, 1000, 0, 0, 0, 0)
	// Four GPUs and 72 cores taken: cosine 0.9487, 30/32.
	short := at(24000, 1000, 1000, 1000, 1000, 0, 0, 0, 0)
	if empty != 1 || two != 1 || four != 1 {
		t.Errorf("shaped as the request %v, two GPUs taken %v, four %v; want 1 for all", empty, two, four)
	}
	if short != 30.0/32 {
		t.Errorf("a node short of CPU %v, want 30/32", short)
	}
}

// The scorer's step per shape gives what a pass over the node gives, for
// every choice of nodes of mixed GPUs, hosts and shapes.
func TestFragDeltaAsAPass(t *testing.T) {
	mix := &Mix{Shapes: []Shape{{Units: 200, Weight: 0.3}, {Units: 500, Type: "T4", HostCPUMilli: 3000, Weight: 0.2}, {GPUs: 2, Weight: 0.1}, {GPUs: 1, Type: "A10", Weight: 0.1}, {HostCPUMilli: 6000, HostMemoryMiB: 100, Weight: 0.3}}}
	for seed := 0; seed < 200; seed++ {
		free := []int{1000, (seed * 137) % 1001, (seed * 71) % 1001, 1000, (seed * 29) % 1001}
		n := fragNode(free...)
		n.GPUs[seed%5].Name = "NVIDIA A10"
		n.GPUs[(seed+2)%5].Unusable = "has failed"
		n.Host = &Host{CPUMilli: 16000, MemoryMiB: 1000, CPUMilliFree: uint64(seed * 97 % 16000), MemoryMiBFree: uint64(seed * 13 % 1000)}
		r := Request{Units: 1 + seed*7%400, HostCPUMilli: uint64(seed * 31 % 5000), HostMemoryMiB: uint64(seed % 50)}
		fs := newFragScorer(n, mix)
		var buf [maxStackGPUs]int
		base := newFragState(n, buf[:])
		if want := fragmentation(n, mix, base, acceptRows(n, mix, nil)); math.Abs(fs.before-want) > 1e-9 {
			t.Fatalf("seed %d: before %v, a pass says %v", seed, fs.before, want)
		}
		for gi := -1; gi < len(free); gi++ {
			units := r.Units
			if gi < 0 {
				units = 0
			} else if base.free[gi] < units {
				continue
			}
			var abuf [maxStackGPUs]int
			after := fragState{free: append(abuf[:0], base.free...), cpuFree: base.cpuFree - min(base.cpuFree, r.HostCPUMilli), memFree: base.memFree - min(base.memFree, r.HostMemoryMiB)}
			if gi >= 0 {
				after.free[gi] -= units
			}
			want := fragmentation(n, mix, after, acceptRows(n, mix, nil)) - fs.before
			if got := fs.delta(r, gi, units); math.Abs(got-want) > 1e-9 {
				t.Fatalf("seed %d, GPU %d: delta %v, a pass says %v", seed, gi, got, want)
			}
		}
	}
}
