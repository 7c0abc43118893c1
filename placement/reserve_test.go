package placement

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestReserve(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(n *Node)
		req    Request
		want   []Choice
		err    error
	}{
		{name: "one instance when it fits", req: Request{Units: 6, UID: 7},
			want: []Choice{{GPU: 0, Instance: 0, Units: []int{0, 1, 2, 3, 4, 5}}}},
		{name: "fullest instances first, across GPUs", change: func(n *Node) {
			take(n, 0, 0, 3, 7)
			take(n, 0, 1, 2, 7)
			take(n, 1, 0, 1, 7)
			take(n, 1, 1, 4, 7)
			n.GPUs[2].Unusable = "95% busy"
		}, req: Request{Units: 16, UID: 7}, want: []Choice{
			{GPU: 1, Instance: 0, Units: []int{1, 2, 3, 4, 5, 6, 7}},
			{GPU: 0, Instance: 1, Units: []int{10, 11, 12, 13, 14, 15}},
			{GPU: 0, Instance: 0, Units: []int{3, 4, 5}},
		}},
		{name: "another user's MPS instance is left out", change: func(n *Node) {
			take(n, 0, 0, 1, 9)
		}, req: Request{Units: 9, UID: 7}, want: []Choice{
			{GPU: 0, Instance: 1, Units: []int{8, 9, 10, 11, 12, 13, 14, 15}},
			{GPU: 1, Instance: 0, Units: []int{0}},
		}},
		{name: "too few: what could be had, with the refusal", change: func(n *Node) {
			n.GPUs[1].Unusable, n.GPUs[2].Unusable = "failed", "failed"
			n.GPUs[0].Instances[1].Down = "is down"
			take(n, 0, 0, 6, 7)
		}, req: Request{Units: 3, UID: 7}, want: []Choice{{GPU: 0, Instance: 0, Units: []int{6, 7}}}, err: api.ErrInsufficientUnits},
		{name: "no more units than the free memory holds the shares of", change: func(n *Node) {
			n.GPUs[1].Unusable, n.GPUs[2].Unusable = "failed", "failed"
			n.GPUs[0].MemoryFreeMiB = 3*5120 + 100
		}, req: Request{Units: 6, UID: 7}, want: []Choice{{GPU: 0, Instance: 0, Units: []int{0, 1, 2}}}, err: api.ErrInsufficientUnits},
		{name: "draining", change: func(n *Node) { n.Draining = true }, req: Request{Units: 1}, err: api.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testNode()
			if tc.change != nil {
				tc.change(n)
			}
			got, err := New(BestFit).Reserve(n, tc.req)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("choices %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
