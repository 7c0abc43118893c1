package inventory

import (
	"log/slog"
	"math"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/api"
)

// processUtilEvery is how many samples pass between two reads of NVML's
// per-process utilization where it only tells each MPS instance's SM figure:
// it cost 1,368 µs a call on an H100, against 39 µs for a GPM sample.
const processUtilEvery = 10

// smMeter measures one GPU's SM utilization, the figure --max-utilization
// compares, by the best means the GPU has. On an H100 with one MPS client on
// 13% of the SMs, utilization.gpu (the share of time in which any kernel ran)
// read 100 while GPM's SM utilization read 12.1; so GPM comes first (Hopper
// and newer), then the sum of NVML's per-process SM utilization, and only
// then utilization.gpu, which then refuses no lease (api.UtilizationRefuses).
type smMeter struct {
	// mu makes one read at a time: the main loop samples, and so does the
	// Xid watcher when a fault fails the GPU, and a read swaps GPM samples.
	mu    sync.Mutex
	lib   nvml.Interface
	h     nvml.Device
	index int
	log   *slog.Logger
	// gpm holds the last GPM sample and the next one's buffer; nil when the
	// GPU has no GPM.
	gpm [2]nvml.GpmSample
	// primed is set once gpm[0] holds a sample to measure from.
	primed bool
	// processUtil is false once the GPU said it cannot give per-process
	// utilization.
	processUtil bool
	lastSeen    uint64
	rounds      int
	smByPID     map[int]int
}

func newSMMeter(lib nvml.Interface, h nvml.Device, index int, log *slog.Logger) *smMeter {
	m := &smMeter{lib: lib, h: h, index: index, log: log, processUtil: true}
	if h == nil {
		return m
	}
	if sup, ret := h.GpmQueryDeviceSupport(); ret != nvml.SUCCESS || sup.IsSupportedDevice == 0 {
		log.Info("GPU has no GPM SM utilization; --max-utilization compares NVML's per-process SM utilization", "gpu", index)
		return m
	}
	for i := range m.gpm {
		s, ret := lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			log.Warn("cannot allocate a GPM sample; --max-utilization compares NVML's per-process SM utilization", "gpu", index, "err", nvmlErr("GPM sample", ret))
			m.free()
			return m
		}
		m.gpm[i] = s
	}
	m.primed = h.GpmSampleGet(m.gpm[0]) == nvml.SUCCESS
	return m
}

func (m *smMeter) free() {
	for i, s := range m.gpm {
		if s != nil {
			s.Free()
			m.gpm[i] = nil
		}
	}
}

// gpmSM reads GPM's SM utilization over the time since the last call.
func (m *smMeter) gpmSM() (int, bool) {
	if m.gpm[0] == nil {
		return 0, false
	}
	if ret := m.h.GpmSampleGet(m.gpm[1]); ret != nvml.SUCCESS {
		m.primed = false
		return 0, false
	}
	was := m.primed
	m.gpm[0], m.gpm[1] = m.gpm[1], m.gpm[0]
	m.primed = true
	if !was {
		return 0, false
	}
	get := nvml.GpmMetricsGetType{NumMetrics: 1, Sample1: m.gpm[1], Sample2: m.gpm[0]}
	get.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	if ret := m.lib.GpmMetricsGet(&get); ret != nvml.SUCCESS || get.Metrics[0].NvmlReturn != uint32(nvml.SUCCESS) {
		return 0, false
	}
	v := get.Metrics[0].Value
	if math.IsNaN(v) || v < 0 {
		return 0, false
	}
	return int(math.Round(min(v, 100))), true
}

// processSM reads NVML's per-process SM utilization when due (always when it
// is the threshold's figure, else every processUtilEvery rounds), and returns
// the last figures read.
func (m *smMeter) processSM(needed bool) map[int]int {
	m.rounds++
	if !m.processUtil || (!needed && m.smByPID != nil && m.rounds%processUtilEvery != 1) {
		return m.smByPID
	}
	samples, ret := m.h.GetProcessUtilization(m.lastSeen)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND:
		// No process ran a kernel since lastSeen.
		m.smByPID = map[int]int{}
		return m.smByPID
	case nvml.ERROR_NOT_SUPPORTED:
		m.processUtil = false
		m.smByPID = nil
		m.log.Warn("GPU gives no per-process utilization: instances show no SM figure", "gpu", m.index)
		return nil
	default:
		return m.smByPID
	}
	latest := map[int]nvml.ProcessUtilizationSample{}
	for _, s := range samples {
		if s.TimeStamp > latest[int(s.Pid)].TimeStamp {
			latest[int(s.Pid)] = s
		}
		m.lastSeen = max(m.lastSeen, s.TimeStamp)
	}
	m.smByPID = make(map[int]int, len(latest))
	for pid, s := range latest {
		m.smByPID[pid] = int(min(s.SmUtil, 100))
	}
	return m.smByPID
}

// read reads one GPU: kernel time, SM utilization, memory and processes.
func (b *NVML) read(index int) Sample {
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
	s := Sample{KernelTimePct: int(u.Gpu), MemoryUsedMiB: mem.Used / (1 << 20)}
	m := b.util[index]
	m.mu.Lock()
	defer m.mu.Unlock()
	sm, gpm := m.gpmSM()
	s.SMByPID = m.processSM(!gpm)
	switch {
	case gpm:
		s.UtilizationPct, s.UtilizationSource = sm, api.UtilSourceGPM
	case s.SMByPID != nil:
		sum := 0
		for _, v := range s.SMByPID {
			sum += v
		}
		s.UtilizationPct, s.UtilizationSource = min(sum, 100), api.UtilSourceProcessSM
	default:
		s.UtilizationPct, s.UtilizationSource = s.KernelTimePct, api.UtilSourceDevice
	}
	// A GPU whose process list cannot be read still serves: its leases show
	// no usage.
	if procs, ret := h.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
		s.Processes = make([]Process, 0, len(procs))
		for _, p := range procs {
			used := p.UsedGpuMemory
			if used == math.MaxUint64 {
				// NVML_VALUE_NOT_AVAILABLE: the driver does not tell (no
				// permission, or a mode that hides it).
				used = 0
			}
			s.Processes = append(s.Processes, Process{PID: int(p.Pid), MemoryUsedMiB: used / (1 << 20)})
		}
	}
	return s
}
