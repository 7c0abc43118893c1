package agent

import (
	"context"
	"path/filepath"
	"time"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/internal/lifecycle"
	"github.com/gpulet/gpulet/mpsctl"
)

// startMPS resolves --mps and brings up the control daemons (a null manager
// when MPS is off). With --mps auto, MPS that does not work here (the binary
// fails, the pipe folders do not fit) leaves gpuletd running without it;
// with --mps on it stops gpuletd. Instances that fail later are down and
// retried by the health checks.
func (b *boot) startMPS(s *lifecycle.Stack) error {
	path, on, err := mpsctl.Resolve(b.cfg.MPS, b.cfg.MPSControl)
	if err != nil {
		return err
	}
	if on && b.cfg.Model.InstancesPerGPU > 1 {
		if err := b.checkComputeModes(); err != nil {
			return err
		}
	}
	runDir, err := filepath.Abs(b.cfg.RunDir)
	if err != nil {
		return err
	}
	uuids := make([]string, len(b.devs))
	for i, d := range b.devs {
		uuids[i] = d.UUID
	}
	cfg := mpsctl.Config{Control: path, RunDir: runDir, InstancesPerGPU: b.cfg.Model.InstancesPerGPU, Logger: b.log}
	if sim := b.inv.Simulator(); sim != nil {
		// No control daemon starts a server without a GPU: the simulated
		// backend's servers stand in for them.
		cfg.Servers = sim
	}
	b.mps, err = mpsctl.Open(b.ctx, b.cfg.MPS, cfg, uuids)
	if err != nil {
		return err
	}
	b.mpsOn = b.mps.On()
	s.Push(b.mps.Close)
	if !b.mpsOn {
		b.log.Info("MPS is off: leases carry no MPS pipe or log folders and no memory limit", "mps", b.cfg.MPS)
	}
	return nil
}

// checkMPS probes the MPS control daemons every interval until ctx ends, in
// a goroutine of its own: a probe that hangs until its timeout must not hold
// up sampling or the watchdog.
func (a *Agent) checkMPS(ctx context.Context, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			a.mps.Check(ctx)
			if a.updateConditions() {
				a.changed()
			}
		}
	}
}

// instanceEnvs are the MPS variables of every instance, by GPU and
// instance, for the lease engine: the daemons' folders are fixed from their
// start on. Nil when MPS is off.
func (a *Agent) instanceEnvs() [][]map[string]string {
	if !a.mpsOn {
		return nil
	}
	out := make([][]map[string]string, len(a.devs))
	for g, d := range a.devs {
		for k := range a.cfg.Model.InstancesPerGPU {
			out[g] = append(out[g], a.mps.Env(d.UUID, k))
		}
	}
	return out
}

// layoutEnv is the environment layout.json gives instance k of GPU g: what a
// process claiming one unit offline runs with.
func (a *Agent) layoutEnv(g, k int) map[string]string {
	return lease.EnvFor(a.cfg.Model, a.devs[g], a.mps.Env(a.devs[g].UUID, k), a.mpsOn, 1, 0)
}
