// Package kubelet makes gpuletd a kubelet device plugin (docs/design.md §14):
// it serves the device-plugin gRPC service on a socket in the kubelet's
// device-plugin folder, registers there for the resource gpulet.io/unit, and
// registers again whenever the kubelet restarts; it lists one device per unit,
// unhealthy while the unit cannot go to a pod; it answers the kubelet's
// preferred allocations with gpulet's placement engine and its allocations
// with leases of kind pod; and it ends those leases when the kubelet's
// pod-resources API no longer lists their devices, rebuilding from that API
// the leases it lacks.
//
// It owns no state of units or leases: the lease engine (agent/lease) does,
// and this package reads its published view and calls its pod methods. The
// kubelet's own API packages (k8s.io/kubelet) and gRPC are the wire.
//
// Files: plugin.go (the service the kubelet calls), devices.go (device ids
// and health), register.go (the plugin socket, registration and the watch of
// the kubelet's folder), podresources.go (the reconcile with pod-resources).
package kubelet

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/pipefile"
)

// ResourceName is the extended resource pods request.
const ResourceName = "gpulet.io/unit"

// Defaults of gpuletd's flags.
const (
	DefaultDir                = pluginapi.DevicePluginPath
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	DefaultInterval           = 5 * time.Second
)

// envNvidiaVisible is what the NVIDIA container runtime reads to give a
// container the GPU's device nodes and driver libraries.
const envNvidiaVisible = "NVIDIA_VISIBLE_DEVICES"

// PodLeases is what the plugin needs of the lease engine: its published view
// (health, reconcile) and the leases of kind pod. *lease.Pods is the real one;
// the plugin's tests may give a fake.
type PodLeases interface {
	View() *lease.View
	PodMayJoin(lease.InstanceView) bool
	PreferPod(available, mustInclude []lease.Unit, size int) ([]lease.Unit, error)
	GrantPod(units []lease.Unit, pod api.LeasePod) (g lease.Grant, reused bool, err error)
	AdoptPod(units []lease.Unit, pod api.LeasePod) (lease.Grant, error)
	EndPod(id, reason string) bool
	SetPod(id string, pod api.LeasePod)
}

// Config wires the plugin.
type Config struct {
	// Dir is the kubelet's device-plugin folder: its registration socket
	// (kubelet.sock) is there, and the plugin's socket goes there.
	Dir string
	// PodResourcesSocket is the kubelet's pod-resources API.
	PodResourcesSocket string
	// Interval is how often the pod-resources API is asked which devices
	// pods hold.
	Interval time.Duration
	// Devices are the node's GPUs and UnitsPerGPU U.
	Devices     []inventory.Device
	UnitsPerGPU int
	// Leases are the lease engine's pod leases (lease.Manager.Pods).
	Leases PodLeases
	// Conditions are what placement reads (draining, eligibility, MPS
	// instances); nil: none.
	Conditions func() *lease.Conditions
	// Changed is closed at the next change of the lease table or the
	// conditions (the snapshot store's change signal).
	Changed func() <-chan struct{}
	Logger  *slog.Logger
}

// Plugin is the running device plugin. Close stops it.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg  Config
	log  *slog.Logger
	devs *devices
	// errLines bounds the lines that failing kubelet calls cause.
	errLines *ratelog.Limiter

	// ctx ends with Close, and with it every goroutine and stream of the
	// plugin.
	ctx  context.Context
	stop context.CancelFunc
	done sync.WaitGroup
	// settleMu guards settleUntil and allocated. Releases wait until
	// settleUntil after gpuletd starts or the kubelet restarts, as the
	// kubelet may list pods late.
	settleMu    sync.Mutex
	settleUntil time.Time
	// allocated is when Allocate last answered with each pod lease: a
	// lease answered again, for a new pod given a gone pod's devices, is
	// as new to the reconcile as one granted then.
	allocated map[string]time.Time
}

// Start serves the device plugin, registers it with the kubelet (now, or as
// soon as the kubelet's socket appears) and starts the reconcile with the
// pod-resources API. Only a plugin socket that cannot be served is an error;
// a kubelet that is not there yet is waited for.
func Start(cfg Config) (*Plugin, error) {
	p := newPlugin(cfg)
	p.settle()
	reg, err := newRegistrar(p)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.done.Add(2)
	go func() {
		defer p.done.Done()
		reg.run(p.ctx)
	}()
	go func() {
		defer p.done.Done()
		p.reconcileLoop()
	}()
	return p, nil
}

// newPlugin is the plugin as Start makes it, neither serving nor
// registered.
func newPlugin(cfg Config) *Plugin {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Conditions == nil {
		cfg.Conditions = func() *lease.Conditions { return nil }
	}
	p := &Plugin{
		cfg: cfg, log: cfg.Logger, devs: newDevices(cfg.Devices, cfg.UnitsPerGPU),
		errLines:  ratelog.New(cfg.Logger, "kubelet errors", 5, nil),
		allocated: map[string]time.Time{},
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	return p
}

// Close stops serving and reconciling. Pod leases stay, for the next start
// to reconcile.
func (p *Plugin) Close() error {
	p.stop()
	p.done.Wait()
	return nil
}

// settle holds releases back for two intervals from now.
func (p *Plugin) settle() {
	p.settleMu.Lock()
	p.settleUntil = time.Now().Add(2 * p.cfg.Interval)
	p.settleMu.Unlock()
}

func (p *Plugin) settled(at time.Time) bool {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	return !at.Before(p.settleUntil)
}

// answered notes that Allocate answers with lease id now.
func (p *Plugin) answered(id string) {
	p.settleMu.Lock()
	p.allocated[id] = time.Now()
	p.settleMu.Unlock()
}

// lastAllocated is when Allocate last answered with lease id, or created
// when that is later.
func (p *Plugin) lastAllocated(id string, created time.Time) time.Time {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	if at := p.allocated[id]; at.After(created) {
		return at
	}
	return created
}

// forgetAllocated drops the notes of leases that are not in live.
func (p *Plugin) forgetAllocated(live map[string]bool) {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	for id := range p.allocated {
		if !live[id] {
			delete(p.allocated, id)
		}
	}
}

// GetDevicePluginOptions says the plugin answers GetPreferredAllocation and
// needs no PreStartContainer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends every unit's health, then again each time it changes.
// It waits on the change signal of the lease table and the conditions, so
// a unit taken outside Kubernetes reaches the kubelet at once.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var last []bool
	for {
		// The channel first: a change after it is either in what is read
		// next or closes it.
		changed := p.cfg.Changed()
		health := p.devs.health(p.cfg.Leases.View(), p.cfg.Conditions(), p.cfg.Leases.PodMayJoin)
		if !slices.Equal(health, last) {
			if err := s.Send(p.devs.list(health)); err != nil {
				return err
			}
			last = health
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		case <-p.ctx.Done():
			return nil
		}
	}
}

// GetPreferredAllocation asks the placement engine, per container, which of
// the devices the kubelet offers it should get.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for i, c := range req.GetContainerRequests() {
		available, err := p.devs.unitsOf(c.GetAvailableDeviceIDs())
		if err != nil {
			return nil, grpcError("available_deviceIDs", i, err)
		}
		must, err := p.devs.unitsOf(c.GetMustIncludeDeviceIDs())
		if err != nil {
			return nil, grpcError("must_include_deviceIDs", i, err)
		}
		chosen, err := p.cfg.Leases.PreferPod(available, must, int(c.GetAllocationSize()))
		if err != nil {
			return nil, grpcError("preferred allocation", i, err)
		}
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: p.devs.idsOf(chosen)})
	}
	return out, nil
}

// Allocate makes a pod lease per container for the devices the kubelet
// chose, and answers with the lease's environment and its MPS instance's
// pipe folder as a mount. When one container cannot get its units, the
// leases made for the others in this call end again.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	var made []string
	for i, c := range req.GetContainerRequests() {
		ids := c.GetDevicesIds()
		units, err := p.devs.unitsOf(ids)
		if err == nil && len(units) == 0 {
			err = api.Errorf(api.ErrBadRequest, "no devices named")
		}
		var g lease.Grant
		var reused bool
		if err == nil {
			g, reused, err = p.cfg.Leases.GrantPod(units, api.LeasePod{Devices: ids})
		}
		if err != nil {
			for _, id := range made {
				p.cfg.Leases.EndPod(id, "another container of the same allocation was refused")
			}
			p.errLines.Log(slog.LevelWarn, "kubelet allocation refused", "container", i, "devices", len(ids), "err", err)
			return nil, grpcError("allocate", i, err)
		}
		if !reused {
			made = append(made, g.ID)
		}
		p.answered(g.ID)
		out.ContainerResponses = append(out.ContainerResponses, containerResponse(g.Lease))
	}
	return out, nil
}

// containerResponse is what a container gets for lease l: the lease's env as
// gpurun gives it, and the MPS pipe folder mounted where the env says.
func containerResponse(l api.Lease) *pluginapi.ContainerAllocateResponse {
	env := make(map[string]string, len(l.Env)+2)
	for k, v := range l.Env {
		env[k] = v
	}
	env[pipefile.EnvLeaseID] = l.ID
	env[envNvidiaVisible] = l.GPU.UUID
	r := &pluginapi.ContainerAllocateResponse{Envs: env}
	if dir := l.Env[pipefile.EnvPipeDirectory]; dir != "" {
		// The same path inside, so that the env holds there too. Writable,
		// as NVIDIA documents MPS in containers.
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: dir, HostPath: dir})
	}
	return r
}

// PreStartContainer is never called: the options say it is not needed.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// grpcError maps gpulet's error vocabulary to gRPC codes, naming what failed
// and for which container of the request.
func grpcError(what string, container int, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, api.ErrBadRequest):
		code = codes.InvalidArgument
	case errors.Is(err, api.ErrInsufficientUnits):
		code = codes.ResourceExhausted
	case errors.Is(err, api.ErrUnavailable):
		code = codes.Unavailable
	}
	return status.Errorf(code, "gpulet: %s for container %d: %v", what, container, err)
}
