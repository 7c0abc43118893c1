package agent

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent/inventory"
)

// Backend is the --backend flag: which GPUs gpuletd serves.
type Backend string

// Values of the --backend flag.
const (
	// BackendAuto is NVML when it initializes, else the simulated backend.
	BackendAuto Backend = "auto"
	BackendNVML Backend = "nvml"
	BackendSim  Backend = "sim"
)

// ParseBackend reads a --backend value: auto, nvml or sim.
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case BackendAuto, BackendNVML, BackendSim:
		return b, nil
	}
	return "", fmt.Errorf("--backend %q: must be auto, nvml or sim", s)
}

// SimGPUs is the --sim-gpus flag: the simulated backend's GPUs, as written
// and as parsed.
type SimGPUs struct {
	Spec   string
	Models []inventory.Model
}

// ParseSimGPUs reads a --sim-gpus value (see [inventory.ParseSimSpec]).
func ParseSimGPUs(spec string) (SimGPUs, error) {
	models, err := inventory.ParseSimSpec(spec)
	if err != nil {
		return SimGPUs{}, err
	}
	return SimGPUs{Spec: spec, Models: models}, nil
}

// OpenInventory picks the backend: NVML when asked or when it initializes under
// "auto", else the simulated backend, said loudly.
func OpenInventory(cfg Config) (inventory.Inventory, error) {
	sim := func() inventory.Inventory { return inventory.NewSim(cfg.NodeName, cfg.SimGPUs.Models) }
	switch cfg.Backend {
	case BackendSim:
		return sim(), nil
	case BackendNVML:
		return inventory.NewNVML(cfg.NVML, cfg.Logger)
	case BackendAuto:
		inv, err := inventory.NewNVML(cfg.NVML, cfg.Logger)
		if err == nil {
			return inv, nil
		}
		cfg.Logger.Warn("NVML is not usable, so gpuletd runs the SIMULATED backend: its GPUs are not real", "why", err.Error(), "sim-gpus", cfg.SimGPUs.Spec)
		return sim(), nil
	}
	// Only a Config not made by ParseFlags gets here.
	return nil, fmt.Errorf("backend %q is none of auto, nvml and sim", cfg.Backend)
}

// checkComputeModes refuses several MPS servers per GPU where the compute mode
// admits one process only.
func (a *Agent) checkComputeModes() error {
	for i := range a.devs {
		mode, err := a.inv.ComputeMode(i)
		if err != nil {
			continue
		}
		if mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS || mode == nvml.COMPUTEMODE_PROHIBITED {
			return fmt.Errorf("--instances-per-gpu %d needs a GPU that admits several processes, but GPU %d's compute mode is %s; use --instances-per-gpu 1 or set the compute mode to DEFAULT (nvidia-smi -c DEFAULT)",
				a.cfg.Model.InstancesPerGPU, i, computeModeName(mode))
		}
	}
	return nil
}

func computeModeName(m nvml.ComputeMode) string {
	switch m {
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "EXCLUSIVE_PROCESS"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "PROHIBITED"
	}
	return strconv.Itoa(int(m))
}
