package kubelet

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/kubelettest"
)

// lister is a pod-resources client whose List the test answers: list runs as
// the List does, then its answer is returned.
type lister struct {
	list func() []*podresourcesapi.PodResources
}

func (l lister) List(context.Context, *podresourcesapi.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesapi.ListPodResourcesResponse, error) {
	if l.list == nil {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: l.list()}, nil
}

func listed(pods ...*podresourcesapi.PodResources) lister {
	return lister{func() []*podresourcesapi.PodResources { return pods }}
}

// driven is a node whose plugin's own reconcile lists once at start and then
// not again, settled: the test drives the reconcile itself.
func driven(t *testing.T) (*node, *reconciler) {
	n := newNodeEvery(t, time.Hour)
	testutil.Eventually(t, "the plugin's own List", func() bool { return n.kubelet.Lists() > 0 })
	unsettle(n.plugin)
	return n, &reconciler{misses: map[string]int{}, warned: map[string]bool{}}
}

// allocatedAt is when the reconcile counts pod lease id as new from: its
// grant, or Allocate's last answer with it.
func allocatedAt(t *testing.T, n *node, id string) time.Time {
	t.Helper()
	l, err := n.leases.Get(identity.Peer{Admin: true}, id)
	if err != nil {
		t.Fatal(err)
	}
	return n.plugin.lastAllocated(id, l.Created)
}

// clockPasses returns once the clock reads later than at: a List that starts
// then began after what happened at at.
func clockPasses(at time.Time) {
	for !time.Now().After(at) {
		runtime.Gosched()
	}
}

func unsettle(p *Plugin) {
	p.settleMu.Lock()
	p.settleUntil = time.Time{}
	p.settleMu.Unlock()
}

func (lister) GetAllocatableResources(context.Context, *podresourcesapi.AllocatableResourcesRequest, ...grpc.CallOption) (*podresourcesapi.AllocatableResourcesResponse, error) {
	return nil, nil
}

func (lister) Get(context.Context, *podresourcesapi.GetPodResourcesRequest, ...grpc.CallOption) (*podresourcesapi.GetPodResourcesResponse, error) {
	return nil, nil
}

// TestAllocatedAgainIsNewToTheReconcile: a pod that ended has one List
// missing its lease; the kubelet then gives the same devices to a new pod,
// and Allocate answers with that lease. A List that began before the
// kubelet recorded the new pod misses it too, but is no second miss: the
// lease is the new pod's now, as new as a lease granted then.
func TestAllocatedAgainIsNewToTheReconcile(t *testing.T) {
	n, r := driven(t)
	p := n.plugin
	ids := n.ids(0, 1, 2)
	resp, err := n.allocate(t, ids)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerResponses[0].Envs["GPULET_LEASE_ID"]
	// The lease was granted before the Lists below began.
	clockPasses(allocatedAt(t, n, id))
	p.reconcile(listed(kubelettest.Pod("ns", "old", "c", ResourceName, ids...)), r)
	// The pod ends: one List misses its lease.
	p.reconcile(listed(), r)
	// The kubelet allocates the same devices to a new pod while a List is
	// under way, and records them only after that List answered.
	p.reconcile(lister{func() []*podresourcesapi.PodResources {
		again, err := n.allocate(t, ids)
		if err != nil {
			t.Fatal(err)
		}
		if got := again.ContainerResponses[0].Envs["GPULET_LEASE_ID"]; got != id {
			t.Fatalf("allocated again: lease %s, want %s", got, id)
		}
		return nil
	}}, r)
	if _, err := n.leases.Get(identity.Peer{Admin: true}, id); err != nil {
		t.Fatalf("the new pod's lease ended before any List could list it: %v", err)
	}
	// Listed once, then missed twice: it ends.
	p.reconcile(listed(kubelettest.Pod("ns", "new", "c", ResourceName, ids...)), r)
	p.reconcile(listed(), r)
	p.reconcile(listed(), r)
	if _, err := n.leases.Get(identity.Peer{Admin: true}, id); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the lease outlived its pod: %v", err)
	}
}

// TestKubeletBackAfterFailedListsSettles: the kubelet's pod-resources API
// answers as soon as a restarting kubelet starts, before the kubelet has
// learnt its pods again and before it makes its registration socket. A List
// that answers after Lists failed is of a kubelet (re)started: the Lists of
// the next two intervals do not count, as after the kubelet's socket.
func TestKubeletBackAfterFailedListsSettles(t *testing.T) {
	n, r := driven(t)
	p := n.plugin
	ids := n.ids(1, 3)
	resp, err := n.allocate(t, ids)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerResponses[0].Envs["GPULET_LEASE_ID"]
	clockPasses(allocatedAt(t, n, id))
	p.reconcile(listed(kubelettest.Pod("ns", "train", "c", ResourceName, ids...)), r)
	// The kubelet stops, and starts again knowing no pod yet.
	p.reconcile(lister{}, r)
	p.reconcile(listed(), r)
	p.reconcile(listed(), r)
	if _, err := n.leases.Get(identity.Peer{Admin: true}, id); err != nil {
		t.Fatalf("the pod's lease ended while the restarting kubelet had not listed its pods yet: %v", err)
	}
	// Settled, two Lists that miss it end it.
	unsettle(p)
	p.reconcile(listed(), r)
	p.reconcile(listed(), r)
	if _, err := n.leases.Get(identity.Peer{Admin: true}, id); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the lease outlived its pod: %v", err)
	}
}
