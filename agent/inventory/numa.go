package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// sysfsPCI is where the kernel lists PCI devices.
const sysfsPCI = "/sys/bus/pci/devices"

// numaNode reads the NUMA node of the PCI device pci from the kernel's PCI
// folder dir; -1 when the kernel does not know it (it says -1 itself on a
// host of one node) or it cannot be read. NVML's own call for it is missing
// from older drivers; sysfs has it everywhere.
func numaNode(dir string, pci nvml.PciInfo) int {
	// GPUs are function 0 of their PCI device.
	name := fmt.Sprintf("%04x:%02x:%02x.0", pci.Domain, pci.Bus, pci.Device)
	b, err := os.ReadFile(filepath.Join(dir, name, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}
