package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// wholeNode is four GPUs of 8 units, one instance each, GPUs 0–1 on NUMA
// node 0 and 2–3 on NUMA node 1, all free.
func wholeNode() *Node {
	n := &Node{ClientsPerInstance: 4}
	for gi := 0; gi < 4; gi++ {
		g := GPU{Index: gi, UUID: fmt.Sprintf("GPU-%d", gi), Name: "NVIDIA A100-SXM4-80GB", MemoryTotalMiB: 81920, MemoryFreeMiB: 81920, Free: 8, Units: 8, NUMANode: gi / 2}
		in := Instance{Index: 0, Size: 8}
		for u := 0; u < 8; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		g.Instances = []Instance{in}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

func TestWholeGPUs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(n *Node)
		policy  Policy
		req     Request
		want    []int
		err     error
		never   bool
		message string
	}{
		{name: "two of one NUMA node", req: Request{GPUs: 2}, want: []int{0, 1}},
		{name: "best fit takes the NUMA node with fewer whole GPUs", change: func(n *Node) { take(n, 0, 0, 1, 7) }, req: Request{GPUs: 1}, want: []int{1}},
		{name: "spread takes the NUMA node with more whole GPUs", change: func(n *Node) { take(n, 0, 0, 1, 7) }, policy: Spread, req: Request{GPUs: 1}, want: []int{2}},
		{name: "first fit takes the lowest", change: func(n *Node) { take(n, 0, 0, 1, 7) }, policy: FirstFit, req: Request{GPUs: 1}, want: []int{1}},
		{name: "a pair across NUMA nodes when no node has two", change: func(n *Node) { take(n, 0, 0, 1, 7); take(n, 3, 0, 1, 7) }, req: Request{GPUs: 2}, want: []int{1, 2}},
		{name: "the same NUMA node first, then the rest", change: func(n *Node) { take(n, 0, 0, 1, 7) }, req: Request{GPUs: 3}, want: []int{1, 2, 3}},
		{name: "all four", req: Request{GPUs: 4}, want: []int{0, 1, 2, 3}},
		{name: "an MPS client makes a GPU not whole", change: func(n *Node) {
			n.GPUs[1].Instances[0].Clients = 1
			n.GPUs[2].Free = 7
		}, req: Request{GPUs: 3}, err: api.ErrInsufficientUnits, message: "GPU 1 is not whole: instance 0 has 1 MPS client(s); GPU 2 is not whole: 7 of its 8 unit(s) free"},
		{name: "all or nothing", change: func(n *Node) { take(n, 2, 0, 8, 7) }, req: Request{GPUs: 4}, err: api.ErrInsufficientUnits, message: "4 whole GPU(s) asked, 3 of them whole now"},
		{name: "more than the node has never fits", req: Request{GPUs: 5}, err: api.ErrInsufficientUnits, never: true, message: "5 whole GPU(s) asked, and this node has only 4 that could ever be given whole"},
		{name: "type filters", change: func(n *Node) { n.GPUs[3].Name = "Tesla T4" }, req: Request{GPUs: 2, Type: "t4"}, err: api.ErrInsufficientUnits, never: true},
		{name: "memory per GPU", change: func(n *Node) { n.GPUs[0].MemoryFreeMiB = 1000 }, req: Request{GPUs: 2, MemoryMiB: 2000}, want: []int{2, 3}},
		{name: "a failed GPU is not whole", change: func(n *Node) { n.GPUs[0].Unusable = "has failed" }, req: Request{GPUs: 2}, want: []int{2, 3}},
		{name: "naming one GPU is refused", req: Request{GPUs: 2, GPU: "0"}, err: api.ErrBadRequest},
		{name: "the host's CPU", change: func(n *Node) {
			n.Host = &Host{CPUMilli: 8000, MemoryMiB: 1 << 20, CPUMilliFree: 1000, MemoryMiBFree: 1 << 20}
		}, req: Request{GPUs: 1, HostCPUMilli: 2000}, err: api.ErrInsufficientUnits, message: "the host has 1000 millicores free, 2000 asked"},
		{name: "the host's memory never", change: func(n *Node) { n.Host = &Host{CPUMilli: 8000, MemoryMiB: 100, CPUMilliFree: 8000, MemoryMiBFree: 100} }, req: Request{GPUs: 1, HostMemoryMiB: 200}, err: api.ErrInsufficientUnits, never: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := wholeNode()
			if tc.change != nil {
				tc.change(n)
			}
			p := tc.policy
			if p == "" {
				p = BestFit
			}
			d, err := New(p).Place(n, tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || errors.Is(err, ErrNeverFits) != tc.never || !strings.Contains(fmt.Sprint(err), tc.message) {
					t.Fatalf("got %+v, %v; want %v (never %v) saying %q", d.Choice, err, tc.err, tc.never, tc.message)
				}
				return
			}
			if err != nil || !slices.Equal(d.Choice.GPUs, tc.want) || d.Choice.GPU != tc.want[0] || d.Choice.Units != nil {
				t.Fatalf("got %+v, %v; want GPUs %v", d.Choice, err, tc.want)
			}
		})
	}
}

func TestHostOnlyRequest(t *testing.T) {
	n := wholeNode()
	n.Host = &Host{CPUMilli: 8000, MemoryMiB: 1024, CPUMilliFree: 4000, MemoryMiBFree: 1024}
	d, err := New(BestFit).Place(n, Request{HostCPUMilli: 4000, HostMemoryMiB: 512})
	if err != nil || d.Choice.GPU != -1 || d.Choice.Instance != -1 {
		t.Fatalf("got %+v, %v; want no GPU", d.Choice, err)
	}
	if _, err := New(BestFit).Place(n, Request{HostCPUMilli: 4001}); !errors.Is(err, api.ErrInsufficientUnits) || errors.Is(err, ErrNeverFits) {
		t.Fatalf("4001 millicores of 4000 free: %v", err)
	}
}
