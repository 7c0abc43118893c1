package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/agent/dra"
	"github.com/gpulet/gpulet/agent/kubelet"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/internal/lifecycle"
)

// KubeConfig is what the Kubernetes flags set (docs/design.md §14).
type KubeConfig struct {
	// Plugin serves the kubelet device-plugin API.
	Plugin bool
	// Dir is the kubelet's device-plugin folder.
	Dir string
	// PodResourcesSocket is the kubelet's pod-resources API, asked every
	// Interval which devices pods hold.
	PodResourcesSocket string
	Interval           time.Duration

	// DRA serves Dynamic Resource Allocation as the driver gpu.gpulet.io
	// (docs/kubernetes.md), reaching the API server through DRAKubeconfig
	// (empty: the pod's service account), the kubelet through KubeletRoot
	// and the container runtime through CDIDir.
	DRA                        bool
	DRAKubeconfig, KubeletRoot string
	CDIDir                     string
}

// maxUnixPath is the longest path a Unix socket may have (sun_path less its
// terminating NUL).
const maxUnixPath = 107

// kubeFlags adds the Kubernetes flags to fs.
func kubeFlags(fs *pflag.FlagSet, c *KubeConfig) {
	fs.BoolVar(&c.Plugin, "kubelet-plugin", false, "serve the kubelet's device-plugin API for the resource "+kubelet.ResourceName+": register with the kubelet, lease units to pods")
	fs.StringVar(&c.Dir, "kubelet-dir", strings.TrimSuffix(kubelet.DefaultDir, "/"), "the kubelet's device-plugin folder (its kubelet.sock is there; gpuletd serves "+kubelet.SocketName+" there)")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", kubelet.DefaultPodResourcesSocket, "the kubelet's pod-resources API, which says which devices pods hold")
	fs.DurationVar(&c.Interval, "pod-resources-interval", kubelet.DefaultInterval, "how often the pod-resources API is asked; a pod's lease ends within two of these after the pod (100ms to 5s)")
	fs.BoolVar(&c.DRA, "dra", false, "be the Kubernetes DRA driver "+dra.DriverName+": publish the node's GPUs in ResourceSlices (units and memory per MPS instance, whole GPUs) and lease what the scheduler allocates to ResourceClaims; the node's name is --node-name")
	fs.StringVar(&c.DRAKubeconfig, "dra-kubeconfig", "", "kubeconfig file the DRA driver reaches the API server with (default: the pod's service account)")
	fs.StringVar(&c.KubeletRoot, "dra-kubelet-dir", dra.DefaultKubeletDir, "the kubelet's root folder: the DRA driver serves plugins/"+dra.DriverName+"/dra.sock there and registers in plugins_registry")
	fs.StringVar(&c.CDIDir, "cdi-dir", dra.DefaultCDIDir, "folder of the container runtime's CDI specs, where the DRA driver writes one per prepared claim")
}

// checkKubeFlags checks the Kubernetes flags; those that only mean something
// with --kubelet-plugin are refused without it rather than ignored.
func checkKubeFlags(fs *pflag.FlagSet, c KubeConfig) error {
	if err := checkDRAFlags(fs, c); err != nil {
		return err
	}
	if !c.Plugin {
		for _, name := range []string{"kubelet-dir", "pod-resources-socket", "pod-resources-interval"} {
			if fs.Changed(name) {
				return fmt.Errorf("--%s is for the kubelet plugin: add --kubelet-plugin", name)
			}
		}
		return nil
	}
	for _, f := range []struct{ name, path string }{
		{"--kubelet-dir", filepath.Join(c.Dir, kubelet.SocketName)},
		{"--pod-resources-socket", c.PodResourcesSocket},
	} {
		if !filepath.IsAbs(f.path) {
			return fmt.Errorf("%s %q: must be an absolute path", f.name, f.path)
		}
		if len(f.path) > maxUnixPath {
			return fmt.Errorf("%s: the socket %s is %d bytes long, more than a Unix socket's %d", f.name, f.path, len(f.path), maxUnixPath)
		}
	}
	if c.Interval < 100*time.Millisecond || c.Interval > 5*time.Second {
		return fmt.Errorf("--pod-resources-interval %s: must be between 100ms and 5s (a pod's lease ends within four intervals of the pod at worst, and must within 30s)", c.Interval)
	}
	return nil
}

// startKubelet starts the kubelet plugin when asked; without it, it says
// that pod leases taken back from the journal have nothing to end them.
func (a *Agent) startKubelet(s *lifecycle.Stack) error {
	c := a.cfg.Kube
	if !c.Plugin {
		if n := countPodLeases(a.leases.View()); n > 0 {
			a.log.Warn("pod leases kept from the journal, but without --kubelet-plugin nothing ends them: gpulet release does", "leases", n)
		}
		return nil
	}
	p, err := kubelet.Start(kubelet.Config{
		Dir: c.Dir, PodResourcesSocket: c.PodResourcesSocket, Interval: c.Interval,
		Devices: a.devs, UnitsPerGPU: a.cfg.Model.UnitsPerGPU, Leases: a.leases.Pods(),
		Conditions: a.conditions.Load, Changed: a.store.Changed, Logger: a.log,
	})
	if err != nil {
		return err
	}
	s.Push(p.Close)
	a.log.Info("serving the kubelet device plugin", "resource", kubelet.ResourceName, "dir", c.Dir, "pod-resources", c.PodResourcesSocket)
	return nil
}

func countPodLeases(v *lease.View) int {
	n := 0
	for _, g := range v.GPUs {
		for _, l := range g.Leases {
			if l.Binding == string(lease.KindPod) {
				n++
			}
		}
	}
	return n
}
