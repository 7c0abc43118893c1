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
			if got := fragmentation(n, mix, newFragState(n, buf[:])); got != tc.frag {
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
		if got := unusableFor(n, &tc.shape, s, 2500); got != tc.lost {
			t.Errorf("%+v cannot use %d units, want %d", tc.shape, got, tc.lost)
		}
	}
	// A failed GPU has nothing free to lose.
	n.GPUs[2].Unusable = "has failed"
	if got := fragmentation(n, &Mix{Shapes: []Shape{{Units: 600, Weight: 1}}}, newFragState(n, buf[:])); got != 0 {
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
	for i := 0; i < 30; i++ {
		l.Observe(Request{Units: 200})
		if i%3 == 0 {
			l.Observe(Request{Units: 400})
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
		{"GPU only", Request{Units: 500}, "0.7071"},
		// No GPU: 1 − 1000/100000 × 2000/2000 of the GPU stranded.
		{"CPU only", Request{HostCPUMilli: 1000}, "0.9900"},
		{"whole GPUs count all their units", Request{GPUs: 2, HostCPUMilli: 100000}, "1.0000"},
	} {
		if got := fmt.Sprintf("%.4f", HostAlign(n, tc.req)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	// A node of 16 cores with its two GPUs free loses half their CPU to
	// an 8-core request; one of 104 cores a thirteenth.
	n.Host = &Host{CPUMilli: 16000, CPUMilliFree: 16000}
	small := HostAlign(n, Request{HostCPUMilli: 8000})
	n.Host = &Host{CPUMilli: 104000, CPUMilliFree: 104000}
	if big := HostAlign(n, Request{HostCPUMilli: 8000}); small != 0.5 || big <= small {
		t.Errorf("an 8-core request of no GPU: %v on 16 cores, %v on 104; want 0.5 and more", small, big)
	}
	n.Host = nil
	if got := HostAlign(n, Request{Units: 1}); got != 0 {
		t.Errorf("without a host: %v, want 0", got)
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
		if want := fragmentation(n, mix, base); math.Abs(fs.before-want) > 1e-9 {
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
			want := fragmentation(n, mix, after) - fs.before
			if got := fs.delta(r, gi, units); math.Abs(got-want) > 1e-9 {
				t.Fatalf("seed %d, GPU %d: delta %v, a pass says %v", seed, gi, got, want)
			}
		}
	}
}
