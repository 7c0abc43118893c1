package inventory

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulet/gpulet/api"
)

// newMockServer is go-nvml's DGX A100 mock with the calls gpulet makes that the
// mock leaves unset. An unset call panics, so this list is every NVML call the
// backend makes beyond the mock's defaults.
func newMockServer(t *testing.T) *server.Server {
	t.Helper()
	s := dgxa100.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		util := uint32(10 * i)
		dev.GetNumGpuCoresFunc = func() (int, nvml.Return) { return 6912, nvml.SUCCESS }
		dev.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_SM {
				return 1410, nvml.SUCCESS
			}
			return 1215, nvml.SUCCESS
		}
		dev.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 5120, nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: util}, nvml.SUCCESS
		}
		dev.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return nvml.COMPUTEMODE_DEFAULT, nvml.SUCCESS }
	}
	return s
}

func TestNVMLReadsDevices(t *testing.T) {
	s := newMockServer(t)
	b, err := NewNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Backend() != api.BackendNVML {
		t.Fatalf("backend %q", b.Backend())
	}
	devs := b.Devices()
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	d := devs[3]
	want := s.Devices[3].(*server.Device)
	if d.Index != 3 || d.UUID != want.UUID || !strings.Contains(d.Name, "A100") {
		t.Fatalf("device 3 = %+v", d)
	}
	if d.MemoryTotalMiB != 40960 || d.ComputeCapability() != "8.0" || d.Cores != 6912 || d.MaxSMClockMHz != 1410 || d.MemoryClockMHz != 1215 || d.MemoryBusWidthBit != 5120 {
		t.Fatalf("device figures %+v", d)
	}
	if got := b.Sample(3, Load{}); got.Err != nil || got.UtilizationPct != 30 {
		t.Fatalf("sample %+v", got)
	}
	if m, err := b.ComputeMode(3); err != nil || m != nvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("compute mode %v %v", m, err)
	}
}

func TestNVMLErrorMarksOneGPUFailed(t *testing.T) {
	s := newMockServer(t)
	s.Devices[1].(*server.Device).GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
	}
	s.Devices[2].(*server.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	b, err := NewNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Sample(1, Load{}); got.Err == nil || !strings.Contains(got.Err.Error(), "utilization") {
		t.Fatalf("lost GPU sample %+v, want an error", got)
	}
	if got := b.Sample(2, Load{}); got.Err == nil || !strings.Contains(got.Err.Error(), "UUID") {
		t.Fatalf("GPU without UUID sample %+v, want an error", got)
	}
	if got := b.Sample(0, Load{}); got.Err != nil {
		t.Fatalf("healthy GPU failed too: %v", got.Err)
	}
}

func TestNVMLInitFailure(t *testing.T) {
	s := newMockServer(t)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := NewNVML(s); err == nil {
		t.Fatal("NewNVML succeeded with a failing Init")
	}
}
