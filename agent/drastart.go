package agent

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/agent/dra"
	"github.com/gpulet/gpulet/internal/lifecycle"
)

// checkDRAFlags refuses the DRA driver's flags without --dra, and paths
// that are not absolute or too long for the driver's socket.
func checkDRAFlags(fs *pflag.FlagSet, c KubeConfig) error {
	if !c.DRA {
		for _, name := range []string{"dra-kubeconfig", "dra-kubelet-dir", "cdi-dir"} {
			if fs.Changed(name) {
				return fmt.Errorf("--%s is for the DRA driver: add --dra", name)
			}
		}
		return nil
	}
	for _, f := range []struct{ name, path string }{
		{"--dra-kubelet-dir", c.KubeletRoot},
		{"--cdi-dir", c.CDIDir},
	} {
		if !filepath.IsAbs(f.path) {
			return fmt.Errorf("%s %q: must be an absolute path", f.name, f.path)
		}
	}
	sock := filepath.Join(c.KubeletRoot, "plugins", dra.DriverName, "dra.sock")
	if len(sock) > maxUnixPath {
		return fmt.Errorf("--dra-kubelet-dir: the driver's socket %s is %d bytes long, more than a Unix socket's %d", sock, len(sock), maxUnixPath)
	}
	return nil
}

// startDRA starts the DRA driver when asked.
func (a *Agent) startDRA(s *lifecycle.Stack) error {
	c := a.cfg.Kube
	if !c.DRA {
		return nil
	}
	d, err := dra.Start(dra.Config{
		NodeName: a.cfg.NodeName, Kubeconfig: c.DRAKubeconfig, KubeletDir: c.KubeletRoot, CDIDir: c.CDIDir,
		Claims: a.leases.Claims(), Changed: a.store.Changed, Logger: a.log,
		Node: func() dra.Node {
			return dra.Node{Devices: a.devs, Model: a.cfg.Model, MPS: a.mpsOn, View: a.leases.View(), Conditions: a.conditions.Load()}
		},
	})
	if err != nil {
		return err
	}
	s.Push(d.Close)
	a.log.Info("serving as the DRA driver", "driver", dra.DriverName, "node", a.cfg.NodeName, "kubelet-dir", c.KubeletRoot, "cdi-dir", c.CDIDir)
	return nil
}
