package placement

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestFragFloorIsUnderEveryChoice: on random nodes (GPUs of two models and
// two sizes, some unusable, a host or none) under random mixes (shapes of
// units, of whole GPUs and of no GPU, some of one type, some needing more
// host than is left), FragFloor is at or under the figure of every choice
// of one GPU the request could have, and of the engine's own answer to
// every kind of request; for a request of no GPU it is the figure.
func TestFragFloorIsUnderEveryChoice(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 3000 {
		mix := randomMix(rng)
		e := New(Frag).WithMix(mix)
		n := randomFragNode(rng)
		r := randomFragRequest(rng)
		var memo Memo
		floor := e.FragFloor(n, r, &memo)
		if r.Units > 0 && r.GPUs == 0 {
			fs := newFragScorer(n, mix)
			room := false
			for gi := range n.GPUs {
				if fs.base.free[gi] < r.Units {
					continue
				}
				room = true
				if f := roundScore(fs.delta(r, gi, r.Units)); floor > f {
					t.Fatalf("trial %d: %+v on GPU %d of %+v under %+v: floor %v above the choice's %v", trial, r, gi, fs.base, mix.Shapes, floor, f)
				}
			}
			if !room && !math.IsInf(floor, 1) {
				t.Fatalf("trial %d: no GPU has room for %+v, floor %v", trial, r, floor)
			}
		}
		least := e.FragLeast(n, r, &memo)
		if least < floor {
			t.Fatalf("trial %d: %+v under %+v: FragLeast %v under FragFloor %v", trial, r, mix.Shapes, least, floor)
		}
		d, err := e.Rank(n, r, &memo)
		if err != nil {
			continue
		}
		if least > d.Best.Frag {
			t.Fatalf("trial %d: %+v under %+v: floor %v above the engine's %v", trial, r, mix.Shapes, least, d.Best.Frag)
		}
		if r.Units == 0 && r.GPUs == 0 && floor != d.Best.Frag {
			t.Fatalf("trial %d: a request of no GPU: floor %v, figure %v", trial, floor, d.Best.Frag)
		}
	}
}

// TestFragFloorKept: the floors a memo keeps for requests of the same units
// or GPUs that leave the host enough are the floors read afresh, request
// after request on one node, whatever the request's CPU and memory; so is
// the Align it keeps.
func TestFragFloorKept(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 500 {
		e := New(Frag).WithMix(randomMix(rng))
		n := randomFragNode(rng)
		var memo Memo
		for i := range 40 {
			r := randomFragRequest(rng)
			if rng.IntN(2) == 0 {
				// Few keys, so that most are kept ones.
				r.Units = []int{0, 100, 250, 500, 900}[rng.IntN(5)]
			}
			got, want := e.FragFloor(n, r, &memo), e.FragFloor(n, r, nil)
			if got != want {
				t.Fatalf("trial %d, request %d %+v: kept floor %v, afresh %v", trial, i, r, got, want)
			}
			if got, want := e.Align(n, r, &memo), HostAlign(n, r); got != want {
				t.Fatalf("trial %d, request %d %+v: kept Align %v, HostAlign %v", trial, i, r, got, want)
			}
		}
	}
}

// TestFragFloorOtherPolicies: a floor only the frag policy with a mix has.
func TestFragFloorOtherPolicies(t *testing.T) {
	n := fragNode(100, 900)
	for _, p := range Policies {
		e := New(p)
		if got := e.FragFloor(n, Request{Units: 50}, nil); got != 0 {
			t.Errorf("%s without a mix: floor %v, want 0", p, got)
		}
		if got := e.FragLeast(n, Request{Units: 50}, nil); got != 0 {
			t.Errorf("%s without a mix: least %v, want 0", p, got)
		}
	}
}

func randomMix(rng *rand.Rand) *Mix {
	m := &Mix{}
	for range 1 + rng.IntN(8) {
		sh := Shape{Weight: rng.Float64()}
		switch rng.IntN(4) {
		case 0:
			sh.GPUs = 1 + rng.IntN(3)
		case 1:
		default:
			sh.Units = 1 + rng.IntN(1000)
		}
		if rng.IntN(4) == 0 {
			sh.Type = []string{"t4", "a100"}[rng.IntN(2)]
		}
		if rng.IntN(2) == 0 {
			sh.HostCPUMilli, sh.HostMemoryMiB = uint64(rng.IntN(16)*1000), uint64(rng.IntN(16)*4096)
		}
		m.Shapes = append(m.Shapes, sh)
	}
	return m
}

func randomFragNode(rng *rand.Rand) *Node {
	n := &Node{ClientsPerInstance: 1000}
	for gi := range 1 + rng.IntN(8) {
		units := []int{500, 1000}[rng.IntN(2)]
		free := units
		if rng.IntN(3) > 0 {
			free = rng.IntN(units + 1)
		}
		g := GPU{Index: gi, Name: []string{"Tesla T4", "A100"}[rng.IntN(2)], Free: free, Units: units, MemoryTotalMiB: 1 << 15, MemoryFreeMiB: 1 << 15}
		if rng.IntN(8) == 0 {
			g.Unusable = "is failed"
		}
		in := Instance{Size: units}
		for u := units - free; u < units; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		g.Instances = []Instance{in}
		n.GPUs = append(n.GPUs, g)
	}
	if rng.IntN(4) > 0 {
		n.Host = &Host{CPUMilli: 32000, MemoryMiB: 1 << 16, CPUMilliFree: uint64(rng.IntN(32001)), MemoryMiBFree: uint64(rng.IntN(1<<16 + 1))}
	}
	return n
}

func randomFragRequest(rng *rand.Rand) Request {
	r := Request{HostCPUMilli: uint64(rng.IntN(8) * 1000), HostMemoryMiB: uint64(rng.IntN(8) * 4096)}
	switch rng.IntN(5) {
	case 0:
		r.GPUs = 1 + rng.IntN(3)
	case 1:
	default:
		r.Units = 1 + rng.IntN(1000)
	}
	if rng.IntN(5) == 0 {
		r.Type = "t4"
	}
	return r
}

// TestWholeFloorUnderEveryChoice: a request of whole GPUs has a floor at or
// under the figure of every set of as many whole GPUs of the node, and,
// when no shape of the mix tells GPUs apart and the node's GPUs have as
// many units each, the floor is that figure, the same for every set.
func TestWholeFloorUnderEveryChoice(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	exact := 0
	for trial := range 3000 {
		mix := randomMix(rng)
		if rng.IntN(2) == 0 {
			for i := range mix.Shapes {
				mix.Shapes[i].Type = ""
			}
		}
		n := randomFragNode(rng)
		if rng.IntN(2) == 0 {
			for gi := range n.GPUs {
				g := &n.GPUs[gi]
				if g.Units != n.GPUs[0].Units {
					g.Units, g.Free = n.GPUs[0].Units, n.GPUs[0].Units
					g.Instances = []Instance{{Size: g.Units, FreeUnits: n.GPUs[0].Instances[0].FreeUnits}}
				}
			}
		}
		r := Request{GPUs: 1 + rng.IntN(3), HostCPUMilli: uint64(rng.IntN(8) * 1000), HostMemoryMiB: uint64(rng.IntN(8) * 4096)}
		e := New(Frag).WithMix(mix)
		floor := e.FragFloor(n, r, &Memo{})
		fs := newFragScorer(n, mix)
		var whole []int
		for gi := range n.GPUs {
			if fs.base.free[gi] == n.GPUs[gi].Units {
				whole = append(whole, gi)
			}
		}
		_, tells := e.wholeFigure(fs, r, nil)
		forEachSubset(whole, r.GPUs, func(chosen []int) {
			f := roundScore(e.wholeDelta(n, r, chosen, nil))
			if floor > f {
				t.Fatalf("trial %d: %+v taking %v of %+v under %+v: floor %v above the figure %v", trial, r, chosen, fs.base, mix.Shapes, floor, f)
			}
			if tells && floor != f {
				t.Fatalf("trial %d: %+v taking %v of %+v under %+v: floor %v, figure %v: every choice has one figure", trial, r, chosen, fs.base, mix.Shapes, floor, f)
			}
		})
		if tells {
			exact++
		}
	}
	if exact < 300 {
		t.Fatalf("only %d of 3000 trials had a figure for every choice: the test no longer tries the case", exact)
	}
}

// forEachSubset calls f with each set of k of items, in order.
func forEachSubset(items []int, k int, f func([]int)) {
	var walk func(from int, chosen []int)
	walk = func(from int, chosen []int) {
		if len(chosen) == k {
			f(chosen)
			return
		}
		for i := from; i < len(items); i++ {
			walk(i+1, append(chosen, items[i]))
		}
	}
	walk(0, nil)
}
