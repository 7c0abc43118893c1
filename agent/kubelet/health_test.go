package kubelet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/test/kubelettest"
)

// A free unit is healthy only where a pod could be given it: not on an
// instance whose MPS server serves another user, nor on one whose MPS clients
// are all taken. The kubelet would otherwise count units that Allocate then
// refuses, and place pods that fail admission instead of waiting.
func TestFreeUnitsAPodCannotGetAreUnhealthy(t *testing.T) {
	n := newNode(t)
	seen := len(n.kubelet.Updates())
	user := identity.Peer{UID: 1000, GID: 1000}
	l, err := n.leases.Acquire(context.Background(), user, lease.Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "1"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	start, size := n.model.InstanceRange(l.Instance)
	up, seen := n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 32-size })
	other := start
	if other == l.Units[0] {
		other++
	}
	if h := kubelettest.Health(up.Devices, n.id(1, other)); h != pluginapi.Unhealthy {
		t.Fatalf("a free unit of an instance serving uid 1000 is %s", h)
	}
	if _, err := n.allocate(t, n.ids(1, other)); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "another user") {
		t.Fatalf("allocating it: %v; the health said why not", err)
	}
	if err := n.leases.Release(user, l.ID); err != nil {
		t.Fatal(err)
	}
	_, seen = n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 32 })

	// Instance 0 of GPU 0 full of clients: N pods of a unit each, which the
	// kubelet lists as they run (else the reconcile would end their leases
	// two intervals on, before a loaded machine reads the health).
	var pods []*podresourcesapi.PodResources
	for u := range n.model.ClientsPerInstance {
		if _, err := n.allocate(t, n.ids(0, u)); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, kubelettest.Pod("ns", fmt.Sprintf("pod-%d", u), "main", ResourceName, n.ids(0, u)...))
		n.kubelet.SetPods(pods...)
	}
	_, size = n.model.InstanceRange(0)
	free := size - n.model.ClientsPerInstance
	up, _ = n.kubelet.WaitUpdate(seen, 5*time.Second, func(d []*pluginapi.Device) bool { return kubelettest.Healthy(d) == 32-free })
	last := size - 1
	if h := kubelettest.Health(up.Devices, n.id(0, last)); h != pluginapi.Unhealthy {
		t.Fatalf("a free unit of an instance with all its clients is %s", h)
	}
	if _, err := n.allocate(t, n.ids(0, last)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("allocating it: %v", err)
	}
	// What is reported healthy and free can be allocated.
	if _, err := n.allocate(t, n.ids(0, size)); err != nil {
		t.Fatalf("a healthy unit of the other instance: %v", err)
	}
}
