package placement

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/identity"

	"github.com/gpulet/gpulet/api"
)

// testPools: GPU 0 is in "training" (uid 1000 and group 50), GPU 1 in
// "training" and "shared" (everyone), GPU 2 (the T4) in no pool.
func testPools() []Pool {
	return []Pool{
		{Name: "shared", GPUs: []int{1}, Set: identity.Set{Everyone: true}},
		{Name: "training", GPUs: []int{0, 1}, Set: identity.Set{UIDs: []uint32{1000}, GIDs: []uint32{50}}},
	}
}

func TestPoolAllows(t *testing.T) {
	p := testPools()[1]
	for _, tc := range []struct {
		uid  uint32
		gids []uint32
		want bool
	}{
		{1000, nil, true},
		{1001, nil, false},
		{1001, []uint32{7, 50}, true},
		{1001, []uint32{7}, false},
	} {
		if got := p.Allows(tc.uid, tc.gids); got != tc.want {
			t.Errorf("Allows(%d, %v) = %v, want %v", tc.uid, tc.gids, got, tc.want)
		}
	}
	if !(&Pool{Set: identity.Set{Everyone: true}}).Allows(5, nil) {
		t.Error("a pool naming no users must allow everyone")
	}
}

func TestPools(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(n *Node)
		req     Request
		gpu     int
		err     error
		never   bool
		message string
	}{
		{name: "a member may use the named pool", req: Request{Units: 1, UID: 1000, Pool: "training"}, gpu: 0},
		{name: "a group member may use it", req: Request{Units: 1, UID: 1001, GIDs: []uint32{50}, Pool: "training"}, gpu: 0},
		{name: "a stranger may not", req: Request{Units: 1, UID: 1001, Pool: "training"}, err: api.ErrForbidden, message: "pool training: " + identity.UserName(1001) + " may not lease there"},
		{name: "an admin may", req: Request{Units: 1, UID: 1001, Admin: true, Pool: "training"}, gpu: 0},
		{name: "unknown pool", req: Request{Units: 1, Pool: "nope"}, err: api.ErrNotFound, message: `no pool named "nope" (pools: shared, training)`},
		{name: "named pool keeps the request on its GPUs", req: Request{Units: 1, UID: 1001, Pool: "shared"}, gpu: 1},
		{name: "named pool full: waitable", change: func(n *Node) { take(n, 1, 0, 8, 1001); take(n, 1, 1, 8, 1001) },
			req: Request{Units: 1, UID: 1001, Pool: "shared"}, err: api.ErrInsufficientUnits, message: "GPU 0 is not in pool shared"},
		{name: "named pool without the type never fits", req: Request{Units: 1, UID: 1000, Pool: "training", Type: "T4"}, err: api.ErrInsufficientUnits, never: true, message: "GPU 2 is not in pool training"},
		{name: "no pool named: the fullest allowed pool wins", change: func(n *Node) { take(n, 2, 0, 1, 1000) }, req: Request{Units: 1, UID: 1000}, gpu: 2},
		{name: "a GPU counts through its fullest pool", req: Request{Units: 1, UID: 1000}, gpu: 1},
		{name: "no pool named: a stranger skips pools he may not use", change: func(n *Node) { take(n, 2, 0, 8, 9); take(n, 2, 1, 8, 9) },
			req: Request{Units: 1, UID: 1001}, gpu: 1},
		{name: "only forbidden pools never fit", change: func(n *Node) { n.GPUs = n.GPUs[:1] },
			req: Request{Units: 1, UID: 1001}, err: api.ErrInsufficientUnits, never: true, message: "only in pools you may not use (training)"},
		{name: "the fuller pool wins over the policy", change: func(n *Node) { take(n, 0, 0, 8, 1000); take(n, 2, 0, 1, 9) },
			req: Request{Units: 1, UID: 1000}, gpu: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testNode()
			if tc.change != nil {
				tc.change(n)
			}
			e := New(Spread).WithPools(testPools())
			d, err := e.Place(n, tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || errors.Is(err, ErrNeverFits) != tc.never || !strings.Contains(err.Error(), tc.message) {
					t.Fatalf("err = %v, want %v (never fits: %v) with %q", err, tc.err, tc.never, tc.message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Choice.GPU != tc.gpu {
				t.Errorf("GPU %d, want %d", d.Choice.GPU, tc.gpu)
			}
		})
	}
}

func TestPoolWithoutPools(t *testing.T) {
	_, err := New(BestFit).Place(testNode(), Request{Units: 1, Pool: "p"})
	if !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), "no pools are configured") {
		t.Fatalf("err = %v", err)
	}
}

func TestPreferFastestModel(t *testing.T) {
	prefer := []string{"Tesla T4", "NVIDIA A100-SXM4-80GB"}
	n := testNode()
	d, err := New(BestFit).Place(n, Request{Units: 1, Prefer: prefer})
	if err != nil || d.Choice.GPU != 2 {
		t.Fatalf("got %+v, %v; want the T4 (GPU 2)", d.Choice, err)
	}
	// The T4 full: the next model, never a failure.
	take(n, 2, 0, 8, 9)
	take(n, 2, 1, 8, 9)
	d, err = New(BestFit).Place(n, Request{Units: 1, Prefer: prefer, UID: 9})
	if err != nil || d.Choice.GPU == 2 {
		t.Fatalf("got %+v, %v; want an A100", d.Choice, err)
	}
	// A model the table does not know comes after those it does.
	d, err = New(FirstFit).Place(testNode(), Request{Units: 1, Prefer: []string{"Tesla T4"}})
	if err != nil || d.Choice.GPU != 2 {
		t.Fatalf("got %+v, %v; want the T4", d.Choice, err)
	}
}
