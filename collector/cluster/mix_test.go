package cluster

import (
	"testing"

	"github.com/gpulet/gpulet/placement"
)

// A request that accepts any model goes to the model that the restricted
// part of the mix needs least for what the cluster has of it: the mix asks
// as much of the one P100 node as of the four G2 nodes, so the G2s are the
// ones to give away. Weighed by their share alone, the P100-only and the
// G2-only shapes pull alike, the choices tie, and the smaller node, the
// P100, goes to a request that could have gone anywhere.
func TestScarceModelsAreKept(t *testing.T) {
	mix := &placement.Mix{Shapes: []placement.Shape{
		{Units: 50, Weight: 0.9},
		{Units: 50, Models: "P100", Weight: 0.05},
		{Units: 50, Models: "G2", Weight: 0.05},
	}}
	c := newCluster(t, placement.Frag, spec("p100", "P100", 2, 64000),
		spec("g2-0", "G2", 8, 64000), spec("g2-1", "G2", 8, 64000), spec("g2-2", "G2", 8, 64000), spec("g2-3", "G2", 8, 64000))
	c.SetEngine(placement.New(placement.Frag).WithMix(mix))
	for i := range 8 {
		if v := place(t, c, units(50)); v.Node == "p100" {
			t.Fatalf("request %d of any model went to the P100 node", i)
		}
	}
	// The P100's units are still there for the requests that need them.
	if v := place(t, c, Request{Request: placement.Request{Units: 50}, Models: []string{"P100"}}); v.Node != "p100" {
		t.Fatalf("a P100-only request went to %s", v.Node)
	}
	// The mix given is not changed: the cluster weighs a copy.
	if mix.Shapes[1].Weight != 0.05 {
		t.Fatalf("the mix given was changed: %+v", mix.Shapes)
	}
}

func TestShapeOfListsModelsOnce(t *testing.T) {
	r := Request{Request: placement.Request{Units: 300, HostCPUMilli: 2000}, Models: []string{"V100M32", "P100", "V100M32"}}
	want := placement.Shape{Units: 300, HostCPUMilli: 2000, Models: "P100|V100M32"}
	if got := ShapeOf(r); got != want {
		t.Fatalf("ShapeOf = %+v, want %+v", got, want)
	}
	if got := ShapeOf(units(300)); got.Models != "" {
		t.Fatalf("a request of any model: Models %q", got.Models)
	}
}

// TestMixMoved: a mix is moved by half the sum of its shapes' weight
// changes, a shape of either counted, MixMove or more.
func TestMixMoved(t *testing.T) {
	mix := func(shapes ...placement.Shape) *placement.Mix { return &placement.Mix{Shapes: shapes} }
	units := func(u int, w float64) placement.Shape { return placement.Shape{Units: u, Weight: w} }
	a := mix(units(1, 0.5), units(2, 0.5))
	for _, tc := range []struct {
		name  string
		from  *placement.Mix
		to    *placement.Mix
		moved bool
	}{
		{"none in force", nil, a, true},
		{"the same", a, mix(units(1, 0.5), units(2, 0.5)), false},
		{"4 points from one shape to the other", a, mix(units(1, 0.54), units(2, 0.46)), false},
		{"5 points", a, mix(units(1, 0.55), units(2, 0.45)), true},
		{"a new shape of 4 points", a, mix(units(1, 0.48), units(2, 0.48), units(4, 0.04)), false},
		{"a new shape of 6 points", a, mix(units(1, 0.47), units(2, 0.47), units(4, 0.06)), true},
		{"the same units of another type", a, mix(units(1, 0.5), placement.Shape{Units: 2, Type: "t4", Weight: 0.5}), true},
	} {
		if got := MixMoved(tc.from, tc.to); got != tc.moved {
			t.Errorf("%s: moved %v, want %v", tc.name, got, tc.moved)
		}
	}
}
