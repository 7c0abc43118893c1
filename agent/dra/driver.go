// Package dra is gpuletd's Kubernetes DRA driver, gpu.gpulet.io: it publishes
// the node's GPUs in ResourceSlices (a share device per MPS instance, which
// claims share by units and memory, and a whole-GPU device), and when the
// kubelet prepares a ResourceClaim the scheduler allocated here, it leases
// exactly that (the claim leases of agent/lease) and hands the container the
// lease through a CDI spec. It owns the Kubernetes side only; the lease table
// decides.
package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpulet/gpulet/agent/lease"
)

// DefaultKubeletDir is the kubelet's root folder; the driver's socket is in
// its plugins/gpu.gpulet.io and its registration in plugins_registry.
const DefaultKubeletDir = "/var/lib/kubelet"

// DefaultCDIDir is where the claims' CDI specs go: the runtime's folder for
// specs that do not outlive a reboot, as prepared claims do not.
const DefaultCDIDir = "/var/run/cdi"

// Config is what the driver needs.
type Config struct {
	// NodeName is the Kubernetes node's name: the pool of the slices.
	NodeName string
	// Kubeconfig is the kubeconfig file to reach the API server with; empty
	// for the pod's own service account (in-cluster).
	Kubeconfig string
	// KubeletDir is the kubelet's root folder; CDIDir the CDI spec folder.
	KubeletDir, CDIDir string
	Claims             ClaimLeases
	// Node is the node as the slices show it now; Changed is closed at the
	// next change of the lease table or the GPUs' conditions.
	Node    func() Node
	Changed func() <-chan struct{}
	Logger  *slog.Logger
}

// ClaimLeases is what the driver asks of the lease table
// (lease.Claims): a lease per allocated device of a claim, and their end.
type ClaimLeases interface {
	GrantClaim(lease.ClaimShare) (lease.Grant, bool, error)
	EndClaim(uid, reason string) int
}

// Driver is a running DRA driver.
type Driver struct {
	cfg    Config
	client kubernetes.Interface
	helper *kubeletplugin.Helper
	cancel context.CancelFunc
	done   chan struct{}
}

// Start connects to the API server, registers with the kubelet and starts
// publishing the node's slices.
func Start(cfg Config) (*Driver, error) {
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("DRA driver: %w", err)
	}
	return start(cfg, client)
}

func start(cfg Config, client kubernetes.Interface) (*Driver, error) {
	// The helper serves its socket in the plugin's folder but does not make it.
	pluginDir := filepath.Join(cfg.KubeletDir, "plugins", DriverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return nil, fmt.Errorf("DRA driver: %w", err)
	}
	// The Kubernetes libraries log through klog: into gpuletd's log, as its
	// own lines are.
	klog.SetSlogLogger(cfg.Logger.With("component", "dra"))
	ctx, cancel := context.WithCancel(context.Background())
	d := &Driver{cfg: cfg, client: client, cancel: cancel, done: make(chan struct{})}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(cfg.KubeletDir, "plugins_registry")),
		// Device health is the slices' to say (a GPU that fails leaves them).
		kubeletplugin.HealthService(false),
		kubeletplugin.GRPCInterceptor(d.logCall),
	)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("DRA driver: %w", err)
	}
	d.helper = h
	go d.publish(ctx)
	go d.logRegistration(ctx)
	return d, nil
}

// logCall logs each prepare and unprepare the kubelet asks, with how long
// it took, the claims' fetch from the API server included.
func (d *Driver) logCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	if method == "NodePrepareResources" || method == "NodeUnprepareResources" {
		attrs := []any{"call", method, "seconds", time.Since(t0).Seconds()}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		d.cfg.Logger.Info("DRA driver: kubelet call", attrs...)
	}
	return resp, err
}

// restConfig reaches the API server through path, or as the pod's service
// account when path is empty.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("DRA driver: no --dra-kubeconfig and not in a pod: %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("DRA driver: --dra-kubeconfig %s: %w", path, err)
	}
	return rc, nil
}

// Close stops publishing and serving the kubelet. The slices stay: the
// node's devices and the claims prepared on them outlive a restart.
func (d *Driver) Close() error {
	d.cancel()
	<-d.done
	d.helper.Stop()
	return nil
}

// logRegistration says once whether the kubelet took the driver's
// registration: until it has, the kubelet refuses to prepare the driver's
// claims ("not registered"), and the pods wait.
func (d *Driver) logRegistration(ctx context.Context) {
	for {
		if st := d.helper.RegistrationStatus(); st != nil {
			if st.PluginRegistered {
				d.cfg.Logger.Info("DRA driver registered with the kubelet", "driver", DriverName)
			} else {
				d.cfg.Logger.Error("the kubelet refused the DRA driver's registration", "driver", DriverName, "err", st.Error)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// publishSpacing is the least time between two publications: a burst of
// lease changes makes one.
const publishSpacing = 100 * time.Millisecond

// publish publishes the node's slices now and again at every change that
// changes them.
func (d *Driver) publish(ctx context.Context) {
	defer close(d.done)
	var last []byte
	for {
		changed := d.cfg.Changed()
		res := Resources(d.cfg.NodeName, d.cfg.Node())
		if b, err := json.Marshal(res); err == nil && string(b) != string(last) {
			if err := d.helper.PublishResources(ctx, res); err != nil {
				d.cfg.Logger.Error("DRA driver: cannot publish the node's ResourceSlices", "err", err)
			}
			last = b
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(publishSpacing):
		}
	}
}

// HandleError logs what goes wrong in the background (publishing slices);
// the helper retries, and nothing it reports makes gpuletd stop.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	level := slog.LevelWarn
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		level = slog.LevelError
	}
	d.cfg.Logger.Log(context.Background(), level, "DRA driver: "+msg, "err", err)
}

// WatchHealthStatus is never called: the health service is off (Start).
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
