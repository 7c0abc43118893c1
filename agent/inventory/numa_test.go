package inventory

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNUMANodeFromSysfs(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"0000:07:00.0": "1\n",
		"0000:0f:00.0": "-1\n",
		"0001:a1:00.0": "junk\n",
	} {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		os.WriteFile(filepath.Join(dir, name, "numa_node"), []byte(content), 0o644)
	}
	for _, c := range []struct {
		name string
		pci  nvml.PciInfo
		want int
	}{
		{"known", nvml.PciInfo{Bus: 0x07}, 1},
		{"one node host", nvml.PciInfo{Bus: 0x0f}, -1},
		{"unreadable", nvml.PciInfo{Domain: 1, Bus: 0xa1}, -1},
		{"absent", nvml.PciInfo{Bus: 0x30}, -1},
	} {
		if got := numaNode(dir, c.pci); got != c.want {
			t.Errorf("%s: NUMA node %d, want %d", c.name, got, c.want)
		}
	}
}
