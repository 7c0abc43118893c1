package inventory

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

// testWaitMS is the Xid watcher's wait in tests: Close waits at most this long.
const testWaitMS = 20

// xidEvents is an NVML event set the test feeds: Wait returns what the test
// sends, else times out after its timeout as NVML's does. It records what the
// backend does with the set.
type xidEvents struct {
	t  *testing.T
	ch chan nvml.EventData
	// fail, when set, is what Wait returns instead of waiting.
	fail atomic.Int32

	waits      atomic.Int64
	frees      atomic.Int64
	mu         sync.Mutex // guards registered
	registered []int
}

func (x *xidEvents) send(e nvml.EventData) { x.ch <- e }

// xid sends a critical Xid event of device d.
func (x *xidEvents) xid(d nvml.Device, xid uint64) {
	x.send(nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid})
}

func (x *xidEvents) set() *mock.EventSet {
	return &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			x.waits.Add(1)
			if x.frees.Load() > 0 {
				x.t.Error("Wait on a freed event set")
			}
			if r := nvml.Return(x.fail.Load()); r != nvml.SUCCESS {
				return nvml.EventData{}, r
			}
			select {
			case e := <-x.ch:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return {
			x.frees.Add(1)
			return nvml.SUCCESS
		},
	}
}

// newMockServer is go-nvml's DGX A100 mock with the calls gpulet makes that the
// mock leaves unset. An unset call panics, so this list is every NVML call the
// backend makes beyond the mock's defaults.
func newMockServer(t *testing.T) (*server.Server, *xidEvents) {
	t.Helper()
	s := dgxa100.New()
	x := &xidEvents{t: t, ch: make(chan nvml.EventData)}
	x.fail.Store(int32(nvml.SUCCESS))
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return x.set(), nvml.SUCCESS }
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
		// An A100 has no GPM (Hopper and newer do); per-process utilization
		// then gives the SM figure, none while no kernel ran.
		dev.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{}, nvml.SUCCESS }
		dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			if types != nvml.EventTypeXidCriticalError {
				t.Errorf("GPU %d registered for events %#x, want the critical Xid events", i, types)
			}
			x.mu.Lock()
			x.registered = append(x.registered, i)
			x.mu.Unlock()
			return nvml.SUCCESS
		}
	}
	return s, x
}

// logBuffer collects a logger's lines, safe for the watcher goroutine.
type logBuffer struct{ testutil.SyncBuffer }

func (l *logBuffer) lines(substr string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

func testLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// openNVML opens the backend on s with a short Xid wait, closed at the end of
// the test.
func openNVML(t *testing.T, s *server.Server) (*NVML, *logBuffer) {
	t.Helper()
	log, buf := testLogger()
	b, err := newNVML(s, log, testWaitMS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, buf
}

func TestNVMLReadsDevices(t *testing.T) {
	s, _ := newMockServer(t)
	b, err := NewNVML(s, slog.New(slog.DiscardHandler))
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
	// The mock's A100-SXM4-40GB: 5120 bits at 1215 MHz is its published 1555 GB/s.
	if bw := d.MemoryBandwidthGBps(); bw != 1555 {
		t.Fatalf("bandwidth %d GB/s, want 1555", bw)
	}
	if got := b.Sample(3, Load{}); got.Err != nil || got.KernelTimePct != 30 {
		t.Fatalf("sample %+v", got)
	}
	if m, err := b.ComputeMode(3); err != nil || m != nvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("compute mode %v %v", m, err)
	}
}

// A figure NVML cannot give reads 0 and is logged once, at start; the GPU
// still serves.
func TestNVMLMissingFiguresAreZeroAndLoggedOnce(t *testing.T) {
	s, _ := newMockServer(t)
	dev := s.Devices[2].(*server.Device)
	dev.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		if c == nvml.CLOCK_SM {
			return 0, nvml.ERROR_UNKNOWN
		}
		return 1215, nvml.SUCCESS
	}
	b, log := openNVML(t, s)
	d := b.Devices()[2]
	if !d.CC().IsZero() || d.ComputeCapability() != "0.0" || d.MemoryBusWidthBit != 0 || d.MaxSMClockMHz != 0 || d.MemoryBandwidthGBps() != 0 {
		t.Fatalf("device 2 = %+v, want the missing figures 0", d)
	}
	if d.MemoryClockMHz != 1215 || d.Cores != 6912 {
		t.Fatalf("device 2 = %+v lost figures NVML gave", d)
	}
	if got := b.Sample(2, Load{}); got.Err != nil {
		t.Fatalf("GPU without some figures failed: %v", got.Err)
	}
	lines := log.lines("did not give some of a GPU's figures")
	if len(lines) != 1 {
		t.Fatalf("%d log lines about missing figures, want 1:\n%s", len(lines), log.String())
	}
	for _, want := range []string{"gpu=2", "compute capability: " + nvml.ErrorString(nvml.ERROR_NOT_SUPPORTED),
		"memory bus width: " + nvml.ErrorString(nvml.ERROR_NOT_SUPPORTED), "max SM clock: " + nvml.ErrorString(nvml.ERROR_UNKNOWN)} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q does not say %q", lines[0], want)
		}
	}
	b.Sample(2, Load{})
	if n := len(log.lines("did not give")); n != 1 {
		t.Fatalf("%d lines after more samples, want the one of the start", n)
	}
	if d := b.Devices()[1]; d.ComputeCapability() != "8.0" || d.MemoryBandwidthGBps() != 1555 {
		t.Fatalf("device 1 = %+v, want its figures", d)
	}
}

func TestNVMLErrorMarksOneGPUFailed(t *testing.T) {
	s, _ := newMockServer(t)
	s.Devices[1].(*server.Device).GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
	}
	s.Devices[2].(*server.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	b, _ := openNVML(t, s)
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
	s, _ := newMockServer(t)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := NewNVML(s, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("NewNVML succeeded with a failing Init")
	}
}
