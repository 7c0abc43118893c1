package inventory

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/api"
)

// NVML is the backend of real GPUs. A call that fails for one GPU marks that GPU
// failed in its samples; it never stops the daemon.
type NVML struct {
	lib     nvml.Interface
	devices []Device
	handles []nvml.Device
	// initErrs holds, per GPU, why its static figures could not be read.
	initErrs []error
}

// NewNVML initializes NVML through lib (nvml.New() in production, go-nvml's mock
// in tests) and reads every GPU's static figures.
func NewNVML(lib nvml.Interface) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML init: %s", nvml.ErrorString(ret))
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("NVML device count: %s", nvml.ErrorString(ret))
	}
	if n == 0 {
		lib.Shutdown()
		return nil, fmt.Errorf("NVML found no GPU")
	}
	b := &NVML{lib: lib}
	for i := 0; i < n; i++ {
		d, h, err := readDevice(lib, i)
		b.devices = append(b.devices, d)
		b.handles = append(b.handles, h)
		b.initErrs = append(b.initErrs, err)
	}
	return b, nil
}

func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("NVML %s: %s", what, nvml.ErrorString(ret))
}

// readDevice reads what does not change. Missing optional figures (cores, clocks,
// bus width) stay zero; a missing identity or memory size is an error.
func readDevice(lib nvml.Interface, i int) (Device, nvml.Device, error) {
	d := Device{Index: i, UUID: fmt.Sprintf("GPU-unknown-%d", i), Name: "unknown"}
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, nil, nvmlErr("device handle", ret)
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = uuid
	} else {
		return d, nil, nvmlErr("UUID", ret)
	}
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	} else {
		return d, nil, nvmlErr("name", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, nil, nvmlErr("memory info", ret)
	}
	d.MemoryTotalMiB = mem.Total / (1 << 20)
	if maj, min, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		d.CCMajor, d.CCMinor = maj, min
	}
	if c, ret := h.GetNumGpuCores(); ret == nvml.SUCCESS {
		d.Cores = c
	}
	if c, ret := h.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		d.MaxSMClockMHz = int(c)
	}
	if c, ret := h.GetMaxClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		d.MemoryClockMHz = int(c)
	}
	if w, ret := h.GetMemoryBusWidth(); ret == nvml.SUCCESS {
		d.MemoryBusWidthBit = int(w)
	}
	return d, h, nil
}

func (b *NVML) Backend() string   { return api.BackendNVML }
func (b *NVML) Devices() []Device { return append([]Device(nil), b.devices...) }

// Close shuts NVML down.
func (b *NVML) Close() error {
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return nvmlErr("shutdown", ret)
	}
	return nil
}

// Sample reads utilization and memory in use; load is not needed for real GPUs.
func (b *NVML) Sample(index int, _ Load) Sample {
	if err := b.initErrs[index]; err != nil {
		return Sample{Err: err}
	}
	h := b.handles[index]
	u, ret := h.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		return Sample{Err: nvmlErr("utilization", ret)}
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Sample{Err: nvmlErr("memory info", ret)}
	}
	return Sample{UtilizationPct: int(u.Gpu), MemoryUsedMiB: mem.Used / (1 << 20)}
}

// ComputeMode reads a GPU's compute mode, for refusing several MPS servers
// on a GPU that allows only one process.
func (b *NVML) ComputeMode(index int) (nvml.ComputeMode, error) {
	if b.handles[index] == nil {
		return 0, b.initErrs[index]
	}
	m, ret := b.handles[index].GetComputeMode()
	if ret != nvml.SUCCESS {
		return 0, nvmlErr("compute mode", ret)
	}
	return m, nil
}
