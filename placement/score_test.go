package placement

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSpanNorm(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		want   []float64
	}{
		{"min–max", []float64{320, 2039, 3352}, []float64{0, (2039 - 320) / (3352.0 - 320), 1}},
		{"all alike: all 1", []float64{1410, 1410}, []float64{1, 1}},
		{"one GPU: 1", []float64{7.5}, []float64{1}},
		{"unknown (0) is the weakest", []float64{0, 320, 2039}, []float64{0, 320 / 2039.0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s span
			for i, v := range tc.values {
				s.add(v, i == 0)
			}
			for i, v := range tc.values {
				if got := s.norm(v); !near(got, tc.want[i]) {
					t.Errorf("norm(%v) = %v, want %v", v, got, tc.want[i])
				}
			}
		})
	}
}

func TestCCValueKeepsTheOrder(t *testing.T) {
	var order []api.ComputeCapability
	for _, v := range [][2]int{{0, 0}, {7, 0}, {7, 5}, {8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 1}} {
		order = append(order, api.ComputeCapability{Major: v[0], Minor: v[1]})
	}
	for i := 1; i < len(order); i++ {
		if !(ccValue(order[i-1]) < ccValue(order[i])) {
			t.Errorf("ccValue(%v) = %v is not below ccValue(%v) = %v", order[i-1], ccValue(order[i-1]), order[i], ccValue(order[i]))
		}
	}
}

func TestVectorsAndCosine(t *testing.T) {
	t4 := &GPU{Units: 16, Free: 4, MemoryTotalMiB: 15360, MemoryFreeMiB: 14000}
	for _, tc := range []struct {
		name         string
		g            *GPU
		r            Request
		free, asked  [2]float64
		wantSimilar  float64
		similarAbove float64 // when wantSimilar < 0: the cosine is above this
	}{
		{name: "memory asked", g: t4, r: Request{Units: 1, MemoryMiB: 7680}, free: [2]float64{0.25, 14000.0 / 15360}, asked: [2]float64{1.0 / 16, 0.5}, wantSimilar: -1, similarAbove: 0.9},
		{name: "no memory asked: the units' share", g: t4, r: Request{Units: 2}, free: [2]float64{0.25, 14000.0 / 15360}, asked: [2]float64{2.0 / 16, 2.0 / 16}, wantSimilar: -1, similarAbove: 0.8},
		{name: "same shape", g: &GPU{Units: 16, Free: 8, MemoryTotalMiB: 81920, MemoryFreeMiB: 40960}, r: Request{Units: 3}, free: [2]float64{0.5, 0.5}, asked: [2]float64{3.0 / 16, 3.0 / 16}, wantSimilar: 1},
		{name: "orthogonal", g: &GPU{Units: 16, Free: 16, MemoryTotalMiB: 81920, MemoryFreeMiB: 0}, r: Request{Units: 1, MemoryMiB: 0}, free: [2]float64{1, 0}, asked: [2]float64{1.0 / 16, 1.0 / 16}, wantSimilar: math.Sqrt(0.5)},
		{name: "memory total unknown", g: &GPU{Units: 16, Free: 16}, r: Request{Units: 1, MemoryMiB: 100}, free: [2]float64{1, 0}, asked: [2]float64{1.0 / 16, 0}, wantSimilar: 1},
		{name: "nothing known", g: &GPU{}, r: Request{Units: 1}, wantSimilar: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			free, asked := vectors(tc.g, tc.r)
			if !near(free[0], tc.free[0]) || !near(free[1], tc.free[1]) || !near(asked[0], tc.asked[0]) || !near(asked[1], tc.asked[1]) {
				t.Fatalf("vectors = %v, %v; want %v, %v", free, asked, tc.free, tc.asked)
			}
			got := cosine(free, asked)
			if got < 0 || got > 1 {
				t.Fatalf("cosine %v outside [0,1]", got)
			}
			if tc.wantSimilar >= 0 && !near(got, tc.wantSimilar) {
				t.Fatalf("cosine = %v, want %v", got, tc.wantSimilar)
			}
			if tc.wantSimilar < 0 && (got <= tc.similarAbove || got >= 1) {
				t.Fatalf("cosine = %v, want it in (%v, 1)", got, tc.similarAbove)
			}
		})
	}
}

func TestWithWeightsCopies(t *testing.T) {
	e := New(Score)
	if e.weights != DefaultWeights {
		t.Fatalf("New's weights %+v", e.weights)
	}
	w := Weights{CC: 1}
	e2 := e.WithWeights(w)
	if e2 == e || e2.weights != w || e2.Policy() != Score || e.weights != DefaultWeights {
		t.Fatalf("WithWeights: %+v %+v", e, e2)
	}
}

// scoreNode is an A100, an H100 and a T4, one instance of 16 units each, with
// their real figures.
func scoreNode() *Node {
	n := &Node{ClientsPerInstance: 16}
	for gi, g := range []struct {
		name string
		mem  uint64
		card Card
	}{
		{"NVIDIA A100-SXM4-80GB", 81920, Card{api.ComputeCapability{Major: 8}, 2039, 1410}},
		{"NVIDIA H100 80GB HBM3", 81559, Card{api.ComputeCapability{Major: 9}, 3352, 1980}},
		{"Tesla T4", 15360, Card{api.ComputeCapability{Major: 7, Minor: 5}, 320, 1590}},
	} {
		in := Instance{Size: 16}
		for u := 0; u < 16; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		n.GPUs = append(n.GPUs, GPU{Index: gi, UUID: fmt.Sprintf("GPU-%d", gi), Name: g.name, Units: 16, Free: 16,
			MemoryTotalMiB: g.mem, MemoryFreeMiB: g.mem, Card: g.card, Instances: []Instance{in}})
	}
	return n
}

// load takes units of GPU g and sets its free memory.
func load(n *Node, g, units int, memFree uint64) {
	gp := &n.GPUs[g]
	gp.Instances[0].FreeUnits = gp.Instances[0].FreeUnits[units:]
	gp.Instances[0].Clients += units
	gp.Free -= units
	gp.MemoryFreeMiB = memFree
}

func TestScorePolicy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(n *Node)
		weights *Weights
		req     Request
		gpu     int
	}{
		{name: "the strongest card when the shapes are alike", req: Request{Units: 1}, gpu: 1},
		{name: "the strongest card, however full, when shapes are alike", change: func(n *Node) { load(n, 1, 14, 81559*2/16) }, req: Request{Units: 1}, gpu: 1},
		{name: "a filter still filters", change: func(n *Node) { n.GPUs[1].Unusable = "is 95% busy" }, req: Request{Units: 1}, gpu: 0},
		// The A100's memory is nearly all used by work gpulet does not see:
		// what it has free is units, not memory. The T4's units are nearly
		// all taken by small jobs: what it has free is memory, as asked.
		{name: "similarity overturns a stronger card", change: func(n *Node) {
			n.GPUs[1].Unusable = "is 95% busy"
			load(n, 0, 0, 12000)
			load(n, 2, 12, 14000)
		}, req: Request{Units: 1, MemoryMiB: 10000}, gpu: 2},
		{name: "weights on the clock alone", weights: &Weights{Clock: 1}, change: func(n *Node) { n.GPUs[1].Unusable = "is 95% busy" }, req: Request{Units: 1}, gpu: 2},
		{name: "no weights: the similarity alone, ties by fit", weights: &Weights{}, change: func(n *Node) { load(n, 2, 4, 15360*12/16) }, req: Request{Units: 1}, gpu: 2},
		{name: "equal cards tie by fit, not index", change: func(n *Node) {
			n.GPUs[1].Card, n.GPUs[1].Name, n.GPUs[1].MemoryTotalMiB = n.GPUs[0].Card, n.GPUs[0].Name, n.GPUs[0].MemoryTotalMiB
			load(n, 1, 6, 81920*10/16)
			load(n, 0, 2, 81920*14/16)
		}, req: Request{Units: 1}, gpu: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := scoreNode()
			if tc.change != nil {
				tc.change(n)
			}
			e := New(Score)
			if tc.weights != nil {
				e = e.WithWeights(*tc.weights)
			}
			d, err := e.Place(n, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Choice.GPU != tc.gpu || d.Policy != Score {
				ex, _ := e.Explain(n, tc.req)
				t.Fatalf("chose GPU %d, want %d; verdicts:\n%s", d.Choice.GPU, tc.gpu, verdictLines(ex.Verdicts))
			}
		})
	}
}

func verdictLines(vs []Verdict) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "  GPU %d kept=%v %s", v.GPU, v.Kept, v.Why)
		if v.Score != nil {
			fmt.Fprintf(&b, " %+v", *v.Score)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Explain gives each kept GPU its score, and the parts add up; GPUs left out
// have none, and so do verdicts of other policies.
func TestExplainScores(t *testing.T) {
	n := scoreNode()
	n.GPUs[2].Unusable = "is 95% busy"
	d, err := New(Score).Explain(n, Request{Units: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Verdicts) != 3 || d.Verdicts[2].Score != nil || d.Verdicts[2].Kept {
		t.Fatalf("verdicts:\n%s", verdictLines(d.Verdicts))
	}
	// The T4 is left out but still sets the range: the A100's clock is the
	// lowest, its cc and bandwidth in between.
	a100, h100 := d.Verdicts[0].Score, d.Verdicts[1].Score
	if a100 == nil || h100 == nil {
		t.Fatalf("kept GPUs without a score:\n%s", verdictLines(d.Verdicts))
	}
	if !near(a100.CC, 0.5/1.5) || !near(a100.Bandwidth, (2039-320)/(3352.0-320)) || !near(a100.Clock, 0) {
		t.Fatalf("A100 parts %+v", *a100)
	}
	if !near(h100.CC, 1) || !near(h100.Bandwidth, 1) || !near(h100.Clock, 1) || !near(h100.Card, 1) {
		t.Fatalf("H100 parts %+v", *h100)
	}
	for _, s := range []*GPUScore{a100, h100} {
		if !near(s.Card, (s.CC+s.Bandwidth+s.Clock)/3) || !near(s.Total, s.Card+s.Similarity) || !near(s.Similarity, 1) {
			t.Fatalf("parts do not add up: %+v", *s)
		}
	}
	d, err = New(BestFit).Explain(n, Request{Units: 1})
	if err != nil || d.Verdicts[0].Score != nil {
		t.Fatalf("best-fit verdicts carry scores: %v\n%s", err, verdictLines(d.Verdicts))
	}
}

// A refusal under the score policy reads as under any other.
func TestScoreRefusal(t *testing.T) {
	n := scoreNode()
	for i := range n.GPUs {
		load(n, i, 16, 0)
	}
	_, err := New(Score).Place(n, Request{Units: 1})
	if err == nil || !strings.Contains(err.Error(), "GPU 1 has 0 unit(s) free") {
		t.Fatalf("err = %v", err)
	}
}

// Two alike GPUs whose free units differ in amount but not in shape score the
// same, to the last bit that counts: the float arithmetic must not pick.
func TestScoreTiesAreExact(t *testing.T) {
	for free := 1; free <= 16; free++ {
		for other := 1; other <= 16; other++ {
			n := scoreNode()
			n.GPUs = n.GPUs[:1]
			n.GPUs = append(n.GPUs, n.GPUs[0])
			n.GPUs[1].Index, n.GPUs[1].Instances = 1, []Instance{{Size: 16, FreeUnits: append([]int(nil), n.GPUs[0].Instances[0].FreeUnits...)}}
			load(n, 0, 16-free, 81920*uint64(free)/16)
			load(n, 1, 16-other, 81920*uint64(other)/16)
			d, err := New(Score).Explain(n, Request{Units: 1})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := d.Verdicts[0].Score.rank(), d.Verdicts[1].Score.rank(); a != b {
				t.Fatalf("free %d and %d: ranks %v and %v differ", free, other, a, b)
			}
			want := 0
			if other < free {
				want = 1
			}
			if d.Choice.GPU != want {
				t.Fatalf("free %d and %d: chose GPU %d, want the tighter %d", free, other, d.Choice.GPU, want)
			}
		}
	}
}
