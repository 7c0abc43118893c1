package placement

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// testNode is two A100s and a T4, two instances each of 8 units, all free.
func testNode() *Node {
	n := &Node{ClientsPerInstance: 4, OneUserPerInstance: true}
	names := []string{"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "Tesla T4"}
	mem := []uint64{81920, 81920, 15360}
	a100 := Card{CC: api.ComputeCapability{Major: 8}, MemoryBandwidthGBps: 2039, SMClockMHz: 1410}
	t4 := Card{CC: api.ComputeCapability{Major: 7, Minor: 5}, MemoryBandwidthGBps: 320, SMClockMHz: 1590}
	cards := []Card{a100, a100, t4}
	for gi, name := range names {
		g := GPU{Index: gi, UUID: fmt.Sprintf("GPU-%d", gi), Name: name, MemoryTotalMiB: mem[gi], MemoryFreeMiB: mem[gi], Free: 16, Units: 16, Card: cards[gi]}
		for k := 0; k < 2; k++ {
			in := Instance{Index: k, Size: 8}
			for u := 8 * k; u < 8*k+8; u++ {
				in.FreeUnits = append(in.FreeUnits, u)
			}
			g.Instances = append(g.Instances, in)
		}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

// take marks the first n free units of instance k of GPU g used by uid.
func take(n *Node, g, k, units int, uid uint32) {
	in := &n.GPUs[g].Instances[k]
	in.FreeUnits = in.FreeUnits[units:]
	in.Clients++
	in.Users = []uint32{uid}
	n.GPUs[g].Free -= units
}

func TestEngineFilters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(n *Node)
		req     Request
		policy  Policy
		gpu     int
		inst    int
		units   []int
		err     error // nil: placed
		never   bool
		message string // part of the error message
	}{
		{name: "first fit takes the first GPU", req: Request{Units: 2}, policy: FirstFit, gpu: 0, inst: 0, units: []int{0, 1}},
		{name: "best fit takes the fullest GPU", change: func(n *Node) { take(n, 1, 1, 5, 7) }, req: Request{Units: 2, UID: 7}, policy: BestFit, gpu: 1, inst: 1, units: []int{13, 14}},
		{name: "spread takes the emptiest GPU", change: func(n *Node) { take(n, 0, 0, 1, 7); take(n, 2, 0, 1, 7) }, req: Request{Units: 1, UID: 7}, policy: Spread, gpu: 1, inst: 0, units: []int{0}},
		{name: "gpu by index", req: Request{Units: 1, GPU: "2"}, gpu: 2, inst: 0, units: []int{0}},
		{name: "gpu by uuid", req: Request{Units: 1, GPU: "gpu-1"}, gpu: 1, inst: 0, units: []int{0}},
		{name: "no such gpu index", req: Request{Units: 1, GPU: "9"}, err: api.ErrBadRequest, message: "no GPU with index 9"},
		{name: "no such gpu uuid", req: Request{Units: 1, GPU: "GPU-x"}, err: api.ErrBadRequest, message: "no GPU with UUID"},
		{name: "type", req: Request{Units: 1, Type: "t4"}, policy: FirstFit, gpu: 2, inst: 0, units: []int{0}},
		{name: "no such type never fits", req: Request{Units: 1, Type: "H100"}, err: api.ErrInsufficientUnits, never: true, message: `not of type "H100"`},
		{name: "more memory than any GPU never fits", req: Request{Units: 1, MemoryMiB: 90000}, err: api.ErrInsufficientUnits, never: true, message: "81920 MiB in all"},
		{name: "min cc keeps the cards that reach it", req: Request{Units: 1, MinCC: api.ComputeCapability{Major: 8}}, policy: FirstFit, gpu: 0, inst: 0, units: []int{0}},
		{name: "min cc below every card", req: Request{Units: 1, GPU: "2", MinCC: api.ComputeCapability{Major: 7}}, gpu: 2, inst: 0, units: []int{0}},
		{name: "min cc equal to the card", req: Request{Units: 1, GPU: "2", MinCC: api.ComputeCapability{Major: 7, Minor: 5}}, gpu: 2, inst: 0, units: []int{0}},
		{name: "min cc above a card names both", req: Request{Units: 1, GPU: "2", MinCC: api.ComputeCapability{Major: 7, Minor: 6}}, err: api.ErrInsufficientUnits, never: true, message: "GPU 2 has compute capability 7.5, below the 7.6 asked"},
		{name: "min cc above every card never fits", req: Request{Units: 1, MinCC: api.ComputeCapability{Major: 9}}, err: api.ErrInsufficientUnits, never: true, message: "of compute capability 9.0 or above: GPU 0 has compute capability 8.0, below the 9.0 asked"},
		{name: "min cc of a card whose cc is unknown", change: func(n *Node) {
			for i := range n.GPUs {
				n.GPUs[i].Card.CC = api.ComputeCapability{}
			}
		}, req: Request{Units: 1, MinCC: api.ComputeCapability{Major: 1}}, err: api.ErrInsufficientUnits, never: true, message: "has a compute capability its driver does not report, so not the 1.0 asked"},
		{name: "min cc met by a busy card waits", change: func(n *Node) {
			n.GPUs[0].Unusable = "is 95% busy"
			n.GPUs[1].Unusable = "is 95% busy"
		}, req: Request{Units: 1, MinCC: api.ComputeCapability{Major: 8}}, err: api.ErrInsufficientUnits, never: false, message: "GPU 2 has compute capability 7.5, below the 8.0 asked"},
		{name: "more units than an instance owns never fits", req: Request{Units: 9}, err: api.ErrInsufficientUnits, never: true, message: "has no MPS instance of 9 units"},
		{name: "memory free now", change: func(n *Node) { n.GPUs[0].MemoryFreeMiB = 100; n.GPUs[1].MemoryFreeMiB = 100 }, req: Request{Units: 1, MemoryMiB: 20000}, err: api.ErrInsufficientUnits, message: "100 MiB free"},
		{name: "unusable GPU is skipped with its reason", change: func(n *Node) { n.GPUs[0].Unusable = "is 95% busy" }, req: Request{Units: 1, Type: "A100"}, policy: FirstFit, gpu: 1, inst: 0, units: []int{0}},
		{name: "all unusable says why", change: func(n *Node) {
			for i := range n.GPUs {
				n.GPUs[i].Unusable = "failed: Xid 79"
			}
		}, req: Request{Units: 1}, err: api.ErrInsufficientUnits, message: "GPU 2 failed: Xid 79"},
		{name: "instance down", change: func(n *Node) { n.GPUs[2].Instances[0].Down = "is down: MPS control daemon exited" }, req: Request{Units: 1, GPU: "2"}, gpu: 2, inst: 1, units: []int{8}},
		{name: "all instances down says so", change: func(n *Node) {
			n.GPUs[2].Instances[0].Down = "is down"
			n.GPUs[2].Instances[1].Down = "is down"
		}, req: Request{Units: 1, GPU: "2"}, err: api.ErrInsufficientUnits, message: "instance 1 is down"},
		{name: "another user's instance", change: func(n *Node) { take(n, 2, 0, 1, 1000); take(n, 2, 1, 1, 1000) }, req: Request{Units: 1, GPU: "2", UID: 1001}, err: api.ErrInsufficientUnits, message: "serves another user"},
		{name: "own user's instance", change: func(n *Node) { take(n, 2, 0, 1, 1000) }, req: Request{Units: 1, GPU: "2", UID: 1000}, policy: BestFit, gpu: 2, inst: 0, units: []int{1}},
		{name: "mixed users on an instance", change: func(n *Node) {
			take(n, 2, 0, 1, 1000)
			n.GPUs[2].Instances[0].Users = []uint32{1000, 1001}
			take(n, 2, 1, 1, 1001)
		}, req: Request{Units: 1, GPU: "2", UID: 1000}, err: api.ErrInsufficientUnits, message: "instance 0 serves another user"},
		{name: "clients full", change: func(n *Node) {
			n.GPUs[2].Instances[0].Clients = 4
			n.GPUs[2].Instances[1].Clients = 4
		}, req: Request{Units: 1, GPU: "2"}, err: api.ErrInsufficientUnits, message: "has its 4 clients"},
		{name: "draining", change: func(n *Node) { n.Draining = true }, req: Request{Units: 1}, err: api.ErrUnavailable, message: "draining"},
		{name: "users apart only with MPS", change: func(n *Node) { n.OneUserPerInstance = false; take(n, 2, 0, 1, 1000) }, req: Request{Units: 1, GPU: "2", UID: 1001}, policy: BestFit, gpu: 2, inst: 0, units: []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testNode()
			if tc.change != nil {
				tc.change(n)
			}
			p := tc.policy
			if p == "" {
				p = FirstFit
			}
			d, err := New(p).Place(n, tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(fmt.Sprint(err), tc.message) {
					t.Fatalf("err = %v, want %v with %q", err, tc.err, tc.message)
				}
				if got := errors.Is(err, ErrNeverFits); got != tc.never {
					t.Fatalf("never fits = %v, want %v (%v)", got, tc.never, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Choice.GPU != tc.gpu || d.Choice.Instance != tc.inst || fmt.Sprint(d.Choice.Units) != fmt.Sprint(tc.units) {
				t.Fatalf("chose %+v, want GPU %d instance %d units %v", d.Choice, tc.gpu, tc.inst, tc.units)
			}
		})
	}
}

// A decision neither keeps nor changes what it was given.
func TestEngineDoesNotTouchTheNode(t *testing.T) {
	n := testNode()
	before := fmt.Sprintf("%+v", *n)
	d, err := New(BestFit).Place(n, Request{Units: 3})
	if err != nil {
		t.Fatal(err)
	}
	d.Choice.Units[0] = 99
	if after := fmt.Sprintf("%+v", *n); after != before {
		t.Fatalf("node changed:\n%s\n%s", before, after)
	}
}

// Every GPU considered has a verdict, kept or why not.
func TestEngineVerdicts(t *testing.T) {
	n := testNode()
	n.GPUs[0].Unusable = "is 95% busy, above --max-utilization 90%"
	d, err := New(FirstFit).Explain(n, Request{Units: 1, Type: "A100"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Verdict{{GPU: 0, Why: "is 95% busy, above --max-utilization 90%"}, {GPU: 1, Kept: true}, {GPU: 2, Why: `(Tesla T4) is not of type "A100"`}}
	if fmt.Sprint(d.Verdicts) != fmt.Sprint(want) {
		t.Fatalf("verdicts %+v, want %+v", d.Verdicts, want)
	}
}
