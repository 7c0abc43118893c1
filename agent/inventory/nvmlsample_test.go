package inventory

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulet/gpulet/api"
)

// withGPM gives device i of s GPM whose SM utilization reads each of values
// in turn, as an H100's did for MPS clients of known SM shares.
func withGPM(s *server.Server, i int, values ...float64) {
	dev := s.Devices[i].(*server.Device)
	dev.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
		return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS
	}
	dev.GpmSampleGetFunc = func(nvml.GpmSample) nvml.Return { return nvml.SUCCESS }
	s.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) {
		return &mock.GpmSample{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
	}
	n := 0
	s.GpmMetricsGetFunc = func(g *nvml.GpmMetricsGetType) nvml.Return {
		if g.NumMetrics != 1 || g.Metrics[0].MetricId != uint32(nvml.GPM_METRIC_SM_UTIL) || g.Sample1 == g.Sample2 {
			panic("GPM asked for something else than the SM utilization between two samples")
		}
		g.Metrics[0].Value = values[min(n, len(values)-1)]
		n++
		return nvml.SUCCESS
	}
}

// TestNVMLThresholdFigureIsSMUtilization: the figure --max-utilization
// compares is GPM's SM utilization where the GPU has GPM, though
// utilization.gpu reads 100 for one client on 13% of the SMs (H100).
func TestNVMLThresholdFigureIsSMUtilization(t *testing.T) {
	s, _ := newMockServer(t)
	withGPM(s, 0, 12.1, 24.2, 50.0)
	s.Devices[0].(*server.Device).GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: 100}, nvml.SUCCESS
	}
	b, _ := openNVML(t, s)
	for _, want := range []int{12, 24, 50} {
		got := b.Sample(0, Load{})
		if got.UtilizationPct != want || got.UtilizationSource != api.UtilSourceGPM || got.KernelTimePct != 100 {
			t.Fatalf("sample %+v, want SM %d%% from GPM and kernel time 100%%", got, want)
		}
	}
}

// TestNVMLWithoutGPMSumsProcessSM: without GPM, the SM figures NVML gives per
// process (per MPS server) add up to the GPU's; the newest sample of each
// process counts, and later reads ask only for samples after it.
func TestNVMLWithoutGPMSumsProcessSM(t *testing.T) {
	s, _ := newMockServer(t)
	var asked []uint64
	s.Devices[1].(*server.Device).GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		asked = append(asked, since)
		return []nvml.ProcessUtilizationSample{
			{Pid: 10, TimeStamp: 5, SmUtil: 90}, {Pid: 10, TimeStamp: 7, SmUtil: 27}, {Pid: 11, TimeStamp: 6, SmUtil: 35},
		}, nvml.SUCCESS
	}
	b, _ := openNVML(t, s)
	got := b.Sample(1, Load{})
	if got.UtilizationPct != 62 || got.UtilizationSource != api.UtilSourceProcessSM || got.SMByPID[10] != 27 || got.SMByPID[11] != 35 {
		t.Fatalf("sample %+v, want 27+35 from the processes' newest samples", got)
	}
	b.Sample(1, Load{})
	if !slices.Equal(asked, []uint64{0, 7}) {
		t.Fatalf("asked for samples since %v, want 0 then 7", asked)
	}
}

// TestNVMLTimeFigureOnlyAsALastResort: a GPU with neither GPM nor
// per-process utilization reports utilization.gpu, marked as such, which the
// threshold does not compare.
func TestNVMLTimeFigureOnlyAsALastResort(t *testing.T) {
	s, _ := newMockServer(t)
	s.Devices[2].(*server.Device).GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	b, _ := openNVML(t, s)
	got := b.Sample(2, Load{})
	if got.UtilizationSource != api.UtilSourceDevice || got.UtilizationPct != got.KernelTimePct || api.UtilizationRefuses(got.UtilizationSource) {
		t.Fatalf("sample %+v, want utilization.gpu marked %q, which refuses nothing", got, api.UtilSourceDevice)
	}
}

// TestNVMLListsComputeProcesses: every compute process with its memory, MPS
// servers and clients alike, as the H100 listed them.
func TestNVMLListsComputeProcesses(t *testing.T) {
	s, _ := newMockServer(t)
	s.Devices[0].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 500, UsedGpuMemory: 66 << 20}, {Pid: 501, UsedGpuMemory: 86 << 20}, {Pid: 502, UsedGpuMemory: ^uint64(0)}}, nvml.SUCCESS
	}
	b, _ := openNVML(t, s)
	want := []Process{{500, 66}, {501, 86}, {502, 0}}
	if got := b.Sample(0, Load{}).Processes; !slices.Equal(got, want) {
		t.Fatalf("processes %+v, want %+v", got, want)
	}
}
