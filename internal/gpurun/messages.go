package gpurun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// What gpurun tells its user about a lease it could not have, or waits for.

// describe turns a lease error into a message that says what to do.
func describe(err error, o Options) error {
	switch {
	case errors.Is(err, client.ErrPermission), errors.Is(err, client.ErrSocketPathTooLong):
		// The message says the fix; gpuletd runs, and --offline needs the
		// same group.
		return err
	case errors.Is(err, client.ErrNoDaemon):
		c := &client.Client{Socket: o.Socket}
		if hint := c.NoDaemonHint(os.Getenv); hint != "" {
			return fmt.Errorf("%w\n  %s", err, hint)
		}
		return fmt.Errorf("%w\n  start gpuletd (systemctl start gpuletd), point --socket or GPULET_SOCKET at its socket,\n  or claim units without it with gpurun --offline", err)
	}
	_, code := api.StatusOf(err)
	if code == api.CodeInternal {
		return err
	}
	msg := fmt.Errorf("%s: %w", code, err)
	if o.Wait > 0 && errors.Is(err, client.ErrUnavailable) && strings.Contains(err.Error(), "draining") {
		// gpuletd queues only for units: a drained node refuses at once.
		return fmt.Errorf("%w; --wait waits for units, not for the node to take leases again: it does once an admin runs gpulet undrain", msg)
	}
	// A refusal that can never fit already says what was asked.
	if errors.Is(err, client.ErrInsufficientUnits) && !strings.Contains(err.Error(), api.NeverFits) {
		msg = fmt.Errorf("%s: asked for %s: %w", code, what(o), err)
		if o.Wait == 0 {
			msg = fmt.Errorf("%w; use --wait DURATION to queue for units", msg)
		}
	}
	return msg
}

// what says what was asked for: "2 unit(s) on GPU 1 of type A100".
func what(o Options) string {
	s := fmt.Sprintf("%d unit(s)", o.Units)
	if o.GPUs > 0 {
		s = fmt.Sprintf("%d whole GPU(s)", o.GPUs)
	}
	if o.GPU != "" {
		s += " on GPU " + o.GPU
	}
	if o.Type != "" {
		s += " of type " + o.Type
	}
	if o.MemoryMiB > 0 {
		s += fmt.Sprintf(" with %d MiB", o.MemoryMiB)
	}
	if o.MinCC != "" {
		s += " of compute capability " + o.MinCC + " or above"
	}
	if o.Pool != "" {
		s += " in pool " + o.Pool
	}
	if o.Reservation != "" {
		s += " of reservation " + o.Reservation
	}
	return s
}

// checkWhole refuses --gpus beside the flags that ask for units of one GPU.
func checkWhole(fs *pflag.FlagSet, o Options) error {
	if !fs.Changed("gpus") {
		return nil
	}
	if o.GPUs < 1 {
		return fmt.Errorf("--gpus must be at least 1, got %d", o.GPUs)
	}
	for _, f := range []string{"units", "gpu", "reservation", "preemptible"} {
		if fs.Changed(f) {
			return fmt.Errorf("--gpus asks for whole GPUs: it cannot be used with --%s", f)
		}
	}
	return nil
}

// placementLine is the dry run's answer: where the lease would go.
func placementLine(o Options, p *api.Placement) string {
	if len(p.GPUs) > 0 {
		gpus := make([]string, len(p.GPUs))
		for i, g := range p.GPUs {
			gpus[i] = fmt.Sprintf("%d (%s)", g.Index, g.UUID)
		}
		return fmt.Sprintf("a lease of %d whole GPU(s) would take GPUs %s, every unit, without MPS (policy %s); nothing was leased",
			o.GPUs, strings.Join(gpus, ", "), p.Policy)
	}
	units := make([]string, len(p.Units))
	for i, u := range p.Units {
		units[i] = strconv.Itoa(u)
	}
	return fmt.Sprintf("a lease of %d unit(s) would go to GPU %d (%s), MPS instance %d, units %s (policy %s); nothing was leased",
		o.Units, p.GPU.Index, p.GPU.UUID, p.Instance, strings.Join(units, ","), p.Policy)
}

// waitMessage says what gpurun waits for and what is free now.
func waitMessage(ctx context.Context, c *client.Client, o Options) string {
	msg := fmt.Sprintf("waiting up to %s for %s (Ctrl-C gives up)", o.Wait, what(o))
	s, err := c.Snapshot(ctx)
	if err != nil {
		return msg
	}
	msg += fmt.Sprintf("; %d of %d units free on the node now", s.UnitsFree, s.UnitsTotal)
	if s.UnitsReserved > 0 {
		msg += fmt.Sprintf(", %d set aside for reservations", s.UnitsReserved)
	}
	// Parse checked it; a GPU whose capability does not read is below it,
	// as gpuletd counts it.
	minCC, _ := api.ParseComputeCapability(o.MinCC)
	var gpus []string
	for _, g := range s.GPUs {
		if !api.MatchGPU(o.GPU, g.Index, g.UUID) || !api.MatchType(o.Type, g.Name) {
			continue
		}
		if cc, err := api.ParseComputeCapability(g.Capability.ComputeCapability); o.MinCC != "" && (err != nil || cc.Less(minCC)) {
			continue
		}
		gpu := fmt.Sprintf("GPU %d %s: %d free", g.Index, g.Name, g.UnitsFree)
		if !g.Eligible {
			gpu += ", not eligible (" + g.State + fmt.Sprintf(", %d%% busy)", g.UtilizationPct)
		}
		gpus = append(gpus, gpu)
	}
	if (o.GPU != "" || o.Type != "" || o.MinCC != "") && len(gpus) > 0 {
		msg += " (" + strings.Join(gpus, "; ") + ")"
	}
	if s.State == api.NodeDraining {
		msg += "; the node is draining"
	}
	return msg
}
