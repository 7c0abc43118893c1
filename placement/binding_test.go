package placement

import (
	"reflect"
	"testing"
)

func TestSurplus(t *testing.T) {
	h := func(size int, holds ...Hold) Holding { return Holding{Size: size, Holds: holds} }
	cases := []struct {
		name string
		gpus [][]Holding
		want map[Slot][]uint32
	}{
		{name: "nobody holds"},
		{name: "one instance each is always kept",
			gpus: [][]Holding{{h(16, Hold{1, 1})}, {h(16, Hold{2, 1})}}},
		{name: "one unit on each of four GPUs keeps the first",
			gpus: [][]Holding{{h(16, Hold{1, 1})}, {h(16, Hold{1, 1})}, {h(16, Hold{1, 1})}, {h(16, Hold{1, 1})}},
			want: map[Slot][]uint32{{1, 0}: {1}, {2, 0}: {1}, {3, 0}: {1}}},
		{name: "the instance with the most units is kept",
			gpus: [][]Holding{{h(8, Hold{1, 1}), h(8, Hold{1, 3})}},
			want: map[Slot][]uint32{{0, 0}: {1}}},
		{name: "more units than one instance holds keep two",
			gpus: [][]Holding{{h(8, Hold{1, 8})}, {h(8, Hold{1, 1})}, {h(8, Hold{1, 1})}},
			want: map[Slot][]uint32{{2, 0}: {1}}},
		{name: "users sharing an instance are judged each on their own",
			gpus: [][]Holding{{h(16, Hold{1, 2}, Hold{2, 1})}, {h(16, Hold{2, 4})}},
			want: map[Slot][]uint32{{0, 0}: {2}}},
		{name: "no units, no hold",
			gpus: [][]Holding{{h(16, Hold{1, 0})}, {h(16, Hold{1, 1})}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Surplus(c.gpus); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Surplus = %v, want %v", got, c.want)
			}
		})
	}
}

// TestEngineLetsOthersOntoSurplusHolds: an instance where another user's
// holds are surplus takes the request; one they keep does not.
func TestEngineLetsOthersOntoSurplusHolds(t *testing.T) {
	n := &Node{ClientsPerInstance: 4, OneUserPerInstance: true}
	for g := range 2 {
		in := Instance{Index: 0, Size: 16, Clients: 1, Users: []uint32{1}, Holds: []Hold{{1, 1}}}
		for u := 1; u < 16; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		n.GPUs = append(n.GPUs, GPU{Index: g, Name: "T4", MemoryTotalMiB: 1000, MemoryFreeMiB: 1000, Free: 15, Units: 16, Instances: []Instance{in}})
	}
	e := New(BestFit)
	d, err := e.Place(n, Request{Units: 1, UID: 2})
	if err != nil || d.Choice.GPU != 1 {
		t.Fatalf("decision %+v, %v: want GPU 1, where user 1's hold is surplus", d, err)
	}
	if _, err := e.Place(n, Request{Units: 1, UID: 2, GPU: "0"}); err == nil {
		t.Fatal("placed on the instance user 1 keeps")
	}
	n.OneUserPerInstance = false
	if d, err := e.Place(n, Request{Units: 1, UID: 2, GPU: "0"}); err != nil || d.Choice.GPU != 0 {
		t.Fatalf("without MPS: %+v %v", d, err)
	}
}
