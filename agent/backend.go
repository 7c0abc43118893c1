package agent

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent/inventory"
)

// checkBackend refuses a --backend other than auto, nvml and sim.
func checkBackend(b string) error {
	switch b {
	case "auto", "nvml", "sim":
		return nil
	}
	return fmt.Errorf("--backend %q: must be auto, nvml or sim", b)
}

// OpenInventory picks the backend: NVML when asked or when it initializes under
// "auto", else the simulated backend, said loudly.
func OpenInventory(cfg Config) (inventory.Inventory, error) {
	if err := checkBackend(cfg.Backend); err != nil {
		return nil, err
	}
	sim := func() (inventory.Inventory, error) {
		models, err := inventory.ParseSimSpec(cfg.SimGPUs)
		if err != nil {
			return nil, err
		}
		return inventory.NewSim(cfg.NodeName, models), nil
	}
	switch cfg.Backend {
	case "sim":
		return sim()
	case "nvml":
		return inventory.NewNVML(cfg.NVML, cfg.Logger)
	}
	// auto
	inv, err := inventory.NewNVML(cfg.NVML, cfg.Logger)
	if err == nil {
		return inv, nil
	}
	s, serr := sim()
	if serr != nil {
		return nil, serr
	}
	cfg.Logger.Warn("NVML is not usable, so gpuletd runs the SIMULATED backend: its GPUs are not real", "why", err.Error(), "sim-gpus", cfg.SimGPUs)
	return s, nil
}

// checkComputeModes refuses several MPS servers per GPU where the compute mode
// admits one process only.
func (a *Agent) checkComputeModes() error {
	n, ok := a.inv.(*inventory.NVML)
	if !ok {
		return nil
	}
	for i := range a.devs {
		mode, err := n.ComputeMode(i)
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
