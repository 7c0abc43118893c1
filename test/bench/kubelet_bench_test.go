package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/test/e2e"
	"github.com/gpulet/gpulet/test/kubelettest"
)

// startKubeletPlugin starts a test kubelet and gpuletd as its device plugin,
// and waits for the first device list.
func startKubeletPlugin(b *testing.B) (*kubelettest.Kubelet, *e2e.Daemon) {
	b.Helper()
	k := kubelettest.Start(b)
	d := startDaemon(b, "--kubelet-plugin", "--kubelet-dir", k.Dir, "--pod-resources-socket", k.PodResourcesSocket)
	k.Wait("gpuletd's device list", 20*time.Second, func() bool { return len(k.Updates()) > 0 })
	return k, d
}

// BenchmarkKubeletListAndWatch is the time from a lease bound to a process
// (gpurun's kind: here the benchmark's own, through its connection) to the
// ListAndWatch answer that shows its unit unhealthy at the kubelet. The
// floor (floor-p50-ns, floor-p99-ns) is the lease request's own round trip,
// which the figure includes. Goal: p99 ≤ 100ms.
func BenchmarkKubeletListAndWatch(b *testing.B) {
	k, d := startKubeletPlugin(b)
	total := len(k.Updates()[0].Devices)
	c := d.Client
	lat := make([]time.Duration, 0, b.N)
	floor := make([]time.Duration, 0, b.N)
	seen := len(k.Updates())
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		l, err := c.Lease(ctx, api.LeaseRequest{Units: 1})
		if err != nil {
			b.Fatal(err)
		}
		floor = append(floor, time.Since(start))
		var up kubelettest.Update
		up, seen = k.WaitUpdate(seen, 10*time.Second, func(devs []*pluginapi.Device) bool { return kubelettest.Healthy(devs) == total-1 })
		lat = append(lat, up.At.Sub(start))
		b.StopTimer()
		err = c.Release(ctx, l.ID)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		_, seen = k.WaitUpdate(seen, 10*time.Second, func(devs []*pluginapi.Device) bool { return kubelettest.Healthy(devs) == total })
		b.StartTimer()
	}
	b.StopTimer()
	reportLatencies(b, "", lat)
	reportLatencies(b, "floor-", floor)
}

// BenchmarkKubeletAllocate is the kubelet's Allocate of one unit, over the
// plugin's gRPC socket: a pod lease made, journaled and answered with its
// env. The floor is GetDevicePluginOptions on the same connection, a call
// that does nothing. Each lease is released between calls, untimed. Goal:
// p99 ≤ 20ms.
func BenchmarkKubeletAllocate(b *testing.B) {
	k, d := startKubeletPlugin(b)
	plugin := k.Plugin()
	id := k.Updates()[0].Devices[0].ID
	ctx := context.Background()
	b.Run("floor", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			start := time.Now()
			if _, err := plugin.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
	})
	b.Run("gpuletd", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}}
		for range b.N {
			start := time.Now()
			resp, err := plugin.Allocate(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			b.StopTimer()
			// The reconcile may have ended it first (the kubelet lists no pod).
			if err := d.Client.Release(ctx, resp.ContainerResponses[0].Envs["GPULET_LEASE_ID"]); err != nil && !errors.Is(err, client.ErrNotFound) {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
	})
}
