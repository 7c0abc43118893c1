package placement

import (
	"slices"
	"testing"
)

// A shape that accepts only some GPU models cannot use the free units of
// the others: they count in its fragmentation, and a decision's figure
// moves with them as it does with Fragmentation.
func TestShapeModels(t *testing.T) {
	n := fragNode(1000, 600) // Tesla T4s
	for _, tc := range []struct {
		name  string
		shape Shape
		frag  float64
	}{
		{"any model", Shape{Units: 500}, 0},
		{"one of its models is the node's", Shape{Units: 500, Models: "P100|T4"}, 0},
		{"none of its models is the node's", Shape{Units: 500, Models: "G2|P100"}, 1600},
		{"its type is not the node's", Shape{Units: 500, Type: "V100"}, 1600},
		{"its models, but not its type", Shape{Units: 500, Type: "V100", Models: "T4"}, 1600},
		{"whole GPUs of none of its models", Shape{GPUs: 1, Models: "G2"}, 1600},
		{"whole GPUs of its models", Shape{GPUs: 1, Models: "t4"}, 600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.shape.Weight = 1
			mix := &Mix{Shapes: []Shape{tc.shape}}
			if got := Fragmentation(n, mix); got != tc.frag {
				t.Fatalf("fragmentation %v, want %v", got, tc.frag)
			}
			fs := newFragScorer(n, mix)
			for gi, f := range []int{1000, 600} {
				var buf [maxStackGPUs]int
				after := newFragState(n, buf[:])
				after.free[gi] -= 100
				// The state after, with the node's GPUs as they were.
				total := 0
				for _, x := range after.free {
					total += x
				}
				want := float64(unusableFor(n, mix, 0, acceptRows(n, mix, nil), after, total))
				if got := fs.before + fs.delta(Request{Units: 100}, gi, 100); got != want {
					t.Errorf("100 units on GPU %d (%d free): %v after, want %v", gi, f, got, want)
				}
			}
		})
	}
}

// The learner keeps, beside its most frequent shapes, the shapes that
// accept only some models, merged by their GPU part: rare one by one (each
// host size its own), they make a class that weighs. The requests that
// accept any model are not merged.
func TestLearnerKeepsRestrictedClasses(t *testing.T) {
	l := NewLearner(1000, 2, 1)
	seen := func(n int, s Shape) {
		for range n {
			l.ObserveShape("", s)
		}
	}
	seen(10, Shape{Units: 100})
	seen(8, Shape{Units: 200})
	seen(2, Shape{Units: 500, Models: "T4", HostCPUMilli: 2000, HostMemoryMiB: 100})
	seen(2, Shape{Units: 500, Models: "T4", HostCPUMilli: 1000, HostMemoryMiB: 300})
	seen(1, Shape{Units: 500, Models: "T4", HostCPUMilli: 3000, HostMemoryMiB: 200})
	seen(1, Shape{Units: 300, HostCPUMilli: 1000})
	seen(1, Shape{Units: 300, HostCPUMilli: 2000})
	seen(1, Shape{GPUs: 2, Models: "G2|T4"})
	total := 26.0
	want := []Shape{
		{Units: 100, Weight: 10 / total},
		{Units: 200, Weight: 8 / total},
		// The class asks the least CPU and memory of its shapes.
		{Units: 500, Models: "T4", HostCPUMilli: 1000, HostMemoryMiB: 100, Weight: 5 / total},
		{GPUs: 2, Models: "G2|T4", Weight: 1 / total},
	}
	if got := l.Mix().Shapes; !slices.Equal(got, want) {
		t.Fatalf("mix %+v,\nwant %+v", got, want)
	}
}

// A mix keeps at most RestrictedClasses classes, the heaviest.
func TestLearnerBoundsRestrictedClasses(t *testing.T) {
	l := NewLearner(10000, 1, 1)
	for i := range RestrictedClasses + 4 {
		for range 1 + i {
			l.ObserveShape("", Shape{Units: 10 + i, Models: "T4"})
		}
	}
	got := l.Mix().Shapes
	if len(got) != 1+RestrictedClasses {
		t.Fatalf("%d shapes, want %d", len(got), 1+RestrictedClasses)
	}
	// The most frequent is the shape kept; the classes follow, heaviest
	// first, down to the lightest kept.
	if got[0].Units != 10+RestrictedClasses+3 || got[1].Units != 10+RestrictedClasses+2 || got[len(got)-1].Units != 10+3 {
		t.Fatalf("mix %+v", got)
	}
}
