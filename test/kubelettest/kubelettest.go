// Package kubelettest is a kubelet for tests, built from the kubelet's own API
// packages and gRPC: a registration server on <dir>/kubelet.sock that, as the
// kubelet does, dials every device plugin that registers and follows its
// ListAndWatch stream; and a pod-resources server whose List answer the test
// sets. It stands in for the kubelet in the tests of gpuletd's device plugin;
// it allocates nothing itself (tests call the plugin's Allocate through
// Plugin) and knows nothing of gpulet.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet is a running test kubelet.
type Kubelet struct {
	// Dir is the device-plugin folder (--kubelet-dir).
	Dir string
	// PodResourcesSocket is the pod-resources API's socket
	// (--pod-resources-socket).
	PodResourcesSocket string

	tb       testing.TB
	register *grpc.Server
	pods     *grpc.Server

	mu sync.Mutex // guards everything below
	// registrations are the Register requests received, oldest first.
	registrations []*pluginapi.RegisterRequest
	// plugin is a client of the plugin that registered last; conn its
	// connection, stream the context of its ListAndWatch.
	plugin       pluginapi.DevicePluginClient
	conn         *grpc.ClientConn
	stopStream   context.CancelFunc
	options      *pluginapi.DevicePluginOptions
	updates      []Update
	listed       []*podresourcesapi.PodResources
	lists        int
	changed      chan struct{}
	streamErrors []error
}

// Update is one ListAndWatch answer and when it arrived.
type Update struct {
	At      time.Time
	Devices []*pluginapi.Device
}

// Start serves a kubelet in a fresh short folder (Unix socket paths are
// short), stopped when the test ends.
func Start(tb testing.TB) *Kubelet {
	tb.Helper()
	root, err := os.MkdirTemp("", "kubelet-")
	if err != nil {
		tb.Fatal(err)
	}
	k := &Kubelet{
		Dir: filepath.Join(root, "device-plugins"), PodResourcesSocket: filepath.Join(root, "pod-resources", "kubelet.sock"),
		tb: tb, changed: make(chan struct{}),
	}
	for _, d := range []string{k.Dir, filepath.Dir(k.PodResourcesSocket)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			tb.Fatal(err)
		}
	}
	ln, err := net.Listen("unix", k.PodResourcesSocket)
	if err != nil {
		tb.Fatal(err)
	}
	k.pods = grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(k.pods, &podServer{k: k})
	go k.pods.Serve(ln)
	k.serveRegistration()
	tb.Cleanup(func() {
		k.register.Stop()
		k.pods.Stop()
		k.mu.Lock()
		k.dropPluginLocked()
		k.mu.Unlock()
		os.RemoveAll(root)
	})
	return k
}

func (k *Kubelet) serveRegistration() {
	k.tb.Helper()
	ln, err := net.Listen("unix", filepath.Join(k.Dir, "kubelet.sock"))
	if err != nil {
		k.tb.Fatal(err)
	}
	k.register = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.register, &registrationServer{k: k})
	go k.register.Serve(ln)
}

// Restart does what a restarting kubelet does to the device-plugin folder:
// it stops serving, drops its plugin, removes everything in the folder
// (plugins' sockets too), and serves a new kubelet.sock.
func (k *Kubelet) Restart() {
	k.tb.Helper()
	k.register.Stop()
	k.mu.Lock()
	k.dropPluginLocked()
	k.mu.Unlock()
	entries, err := os.ReadDir(k.Dir)
	if err != nil {
		k.tb.Fatal(err)
	}
	for _, e := range entries {
		os.RemoveAll(filepath.Join(k.Dir, e.Name()))
	}
	k.serveRegistration()
}

func (k *Kubelet) dropPluginLocked() {
	if k.stopStream != nil {
		k.stopStream()
		k.stopStream = nil
	}
	if k.conn != nil {
		k.conn.Close()
		k.conn = nil
	}
	k.plugin = nil
}

// tellLocked wakes whoever waits for a change.
func (k *Kubelet) tellLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// Registrations are the Register requests received so far.
func (k *Kubelet) Registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*pluginapi.RegisterRequest(nil), k.registrations...)
}

// Options are what the registered plugin said of itself.
func (k *Kubelet) Options() *pluginapi.DevicePluginOptions {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.options
}

// Plugin is a client of the plugin that registered last; nil before one did.
func (k *Kubelet) Plugin() pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.plugin
}

// Updates are the ListAndWatch answers received so far, across plugins.
func (k *Kubelet) Updates() []Update {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]Update(nil), k.updates...)
}

// Wait waits until cond holds, checking it at each change (a registration,
// a ListAndWatch answer), or fails the test after timeout.
func (k *Kubelet) Wait(what string, timeout time.Duration, cond func() bool) {
	k.tb.Helper()
	deadline := time.After(timeout)
	for {
		k.mu.Lock()
		ch := k.changed
		k.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			k.mu.Lock()
			errs := k.streamErrors
			k.mu.Unlock()
			k.tb.Fatalf("timed out after %s waiting for: %s (ListAndWatch errors: %v)", timeout, what, errs)
		}
	}
}

// WaitUpdate waits for a ListAndWatch answer after the n-th for which cond
// holds, and returns it with its number.
func (k *Kubelet) WaitUpdate(after int, timeout time.Duration, cond func([]*pluginapi.Device) bool) (Update, int) {
	k.tb.Helper()
	var got Update
	n := after
	k.Wait("a ListAndWatch answer", timeout, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		for ; n < len(k.updates); n++ {
			if cond(k.updates[n].Devices) {
				got = k.updates[n]
				n++
				return true
			}
		}
		return false
	})
	return got, n
}

// SetPods sets what List answers from now on.
func (k *Kubelet) SetPods(pods ...*podresourcesapi.PodResources) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listed = pods
}

// Lists counts the List calls answered.
func (k *Kubelet) Lists() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lists
}

// Pod is a pod with one container holding devices of resource.
func Pod(namespace, name, container, resource string, ids ...string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: namespace, Name: name, Containers: []*podresourcesapi.ContainerResources{{
		Name:    container,
		Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
	}}}
}

// Healthy counts the healthy devices of an update.
func Healthy(devs []*pluginapi.Device) int {
	n := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// Health finds a device's health in an update; "" when it is not listed.
func Health(devs []*pluginapi.Device, id string) string {
	for _, d := range devs {
		if d.ID == id {
			return d.Health
		}
	}
	return ""
}

type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

// Register checks the request as the kubelet does, then dials the plugin and
// follows its ListAndWatch.
func (s *registrationServer) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := s.k
	if req.GetVersion() != pluginapi.Version {
		return nil, fmt.Errorf("unsupported device plugin API version %q", req.GetVersion())
	}
	if req.GetResourceName() == "" || req.GetEndpoint() == "" || filepath.Base(req.GetEndpoint()) != req.GetEndpoint() {
		return nil, errors.New("a registration needs a resource name and an endpoint in the device-plugin folder")
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.Dir, req.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	plugin := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	k.mu.Lock()
	k.dropPluginLocked()
	k.registrations = append(k.registrations, req)
	k.plugin, k.conn, k.stopStream = plugin, conn, cancel
	k.tellLocked()
	k.mu.Unlock()
	go k.follow(ctx, plugin)
	return &pluginapi.Empty{}, nil
}

// follow asks the plugin's options and records its ListAndWatch answers
// until ctx ends or the stream breaks.
func (k *Kubelet) follow(ctx context.Context, plugin pluginapi.DevicePluginClient) {
	fail := func(err error) {
		k.mu.Lock()
		if ctx.Err() == nil {
			k.streamErrors = append(k.streamErrors, err)
		}
		k.tellLocked()
		k.mu.Unlock()
	}
	opts, err := plugin.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		fail(err)
		return
	}
	k.mu.Lock()
	k.options = opts
	k.mu.Unlock()
	stream, err := plugin.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		fail(err)
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			fail(err)
			return
		}
		at := time.Now()
		k.mu.Lock()
		k.updates = append(k.updates, Update{At: at, Devices: resp.GetDevices()})
		k.tellLocked()
		k.mu.Unlock()
	}
}

type podServer struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	k *Kubelet
}

func (s *podServer) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	s.k.lists++
	return &podresourcesapi.ListPodResourcesResponse{PodResources: s.k.listed}, nil
}
