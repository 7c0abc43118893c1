package inventory

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/ratelog"
)

// NVML is the backend of real GPUs. A call that fails for one GPU marks that GPU
// failed in its samples; it never stops the daemon. A goroutine waits for
// critical Xid events and latches them (see xid.go for the rule).
type NVML struct {
	lib     nvml.Interface
	log     *slog.Logger
	devices []Device
	handles []nvml.Device
	// initErrs holds, per GPU, why its static figures could not be read.
	initErrs []error
	faults   *xidFaults
	// util holds, per GPU, how its SM utilization is measured.
	util []*smMeter

	// events is the Xid event set; nil when no GPU could register for Xids.
	events nvml.EventSet
	// waitMS is how long one wait for an event lasts: the longest Close waits
	// for the watcher to see stop.
	waitMS uint32
	// xidLog bounds the Xid lines: a local user's faulty kernels cause
	// application Xids as fast as they can launch them.
	xidLog *ratelog.Limiter
	// onFault, when set, is called after a critical Xid failed a GPU, so
	// that placement stops using it at once rather than at the next sample.
	onFault   atomic.Pointer[func()]
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// xidWaitMS is the Xid watcher's wait: short enough that stopping gpuletd is not
// held up, long enough that waiting costs nothing.
const xidWaitMS = 500

// xidLinesPerSecond is the budget of Xid event lines.
const xidLinesPerSecond = 20

// NewNVML initializes NVML through lib (nvml.New() in production, go-nvml's mock
// in tests), reads every GPU's static figures and starts watching Xid events.
func NewNVML(lib nvml.Interface, log *slog.Logger) (*NVML, error) {
	return newNVML(lib, log, xidWaitMS)
}

func newNVML(lib nvml.Interface, log *slog.Logger, waitMS uint32) (*NVML, error) {
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
	b := &NVML{lib: lib, log: log, waitMS: waitMS, faults: newXidFaults(n),
		xidLog: ratelog.New(log, "Xid events", xidLinesPerSecond, nil)}
	for i := 0; i < n; i++ {
		d, h, missing, err := readDevice(lib, i)
		if len(missing) > 0 {
			// Said once, at start: the figures do not change, and a GPU that
			// cannot give them still serves.
			log.Warn("NVML did not give some of a GPU's figures; they read 0, and the score policy counts them as the weakest of the node",
				"gpu", i, "missing", strings.Join(missing, "; "))
		}
		b.devices = append(b.devices, d)
		b.handles = append(b.handles, h)
		b.initErrs = append(b.initErrs, err)
		b.util = append(b.util, newSMMeter(lib, h, i, log))
	}
	b.watchXids()
	return b, nil
}

// watchXids registers every GPU for critical Xid events and starts the
// watcher. A GPU that cannot register still works: its faults show only when
// an NVML call fails, and the log says so.
func (b *NVML) watchXids() {
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		b.log.Warn("cannot watch Xid events: GPU faults show only when an NVML call fails", "err", nvmlErr("event set", ret))
		return
	}
	watched := 0
	for i, h := range b.handles {
		if h == nil {
			continue
		}
		if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			b.log.Warn("cannot watch a GPU's Xid events: its faults show only when an NVML call fails", "gpu", i, "err", nvmlErr("Xid event registration", ret))
			continue
		}
		watched++
	}
	if watched == 0 {
		set.Free()
		return
	}
	b.events = set
	b.stop, b.done = make(chan struct{}), make(chan struct{})
	go b.waitXids()
}

// waitXids waits for Xid events until Close. It owns b.events' waits; Close
// frees the set only after this returns.
func (b *NVML) waitXids() {
	defer close(b.done)
	failing := nvml.SUCCESS
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		e, ret := b.events.Wait(b.waitMS)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			b.xidLog.Flush()
			continue
		default:
			// Said once per kind of failure, not once per try; the pause keeps
			// a wait that fails at once from spinning.
			if ret != failing {
				b.log.Error("waiting for Xid events failed; retrying", "err", nvmlErr("event wait", ret))
				failing = ret
			}
			select {
			case <-b.stop:
				return
			case <-time.After(time.Duration(b.waitMS) * time.Millisecond):
			}
			continue
		}
		if failing != nvml.SUCCESS {
			b.log.Info("waiting for Xid events works again")
			failing = nvml.SUCCESS
		}
		if e.EventType&nvml.EventTypeXidCriticalError != 0 {
			b.xidEvent(e)
		}
	}
}

// xidEvent applies one critical Xid event and logs it. An event whose GPU
// cannot be told (its UUID does not read, as on a GPU that fell off the bus)
// counts for every GPU, as NVIDIA's device plugin does: work must not go to a
// GPU that may be the broken one.
func (b *NVML) xidEvent(e nvml.EventData) {
	xid := e.EventData
	var gpus []int
	uuid := ""
	if e.Device != nil {
		if u, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
			uuid = u
		}
	}
	for i, d := range b.devices {
		if uuid == "" || strings.EqualFold(d.UUID, uuid) {
			gpus = append(gpus, i)
		}
	}
	if uuid != "" && len(gpus) == 0 {
		b.xidLog.Log(slog.LevelWarn, "Xid event of a GPU gpuletd does not serve; ignored", "uuid", uuid, "xid", xid, "meaning", XidMeaning(xid))
		return
	}
	for _, i := range gpus {
		b.faults.record(i, xid)
	}
	if f := b.onFault.Load(); f != nil && XidCritical(xid) {
		(*f)()
	}
	var which slog.Attr
	if len(gpus) == 1 {
		which = slog.Int("gpu", gpus[0])
	} else {
		which = slog.Any("gpus", gpus)
	}
	switch {
	case !XidCritical(xid):
		b.xidLog.Log(slog.LevelWarn, "Xid event of an application error; the GPU stays in service", which, "uuid", uuid, "xid", xid, "meaning", XidMeaning(xid))
	case uuid == "":
		b.xidLog.Log(slog.LevelError, "critical Xid event of a GPU whose UUID does not read: every GPU is failed until an admin clears it (gpulet undrain --gpu N) or gpuletd restarts", which, "xid", xid, "meaning", XidMeaning(xid))
	default:
		b.xidLog.Log(slog.LevelError, "critical Xid event: the GPU is failed and takes no new leases until an admin clears it (gpulet undrain --gpu N) or gpuletd restarts", which, "uuid", uuid, "xid", xid, "meaning", XidMeaning(xid))
	}
}

func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("NVML %s: %s", what, nvml.ErrorString(ret))
}

// readDevice reads what does not change. A missing identity or memory size is
// an error (the GPU is then failed); a missing optional figure (compute
// capability, cores, clocks, bus width) stays zero and is named in missing.
func readDevice(lib nvml.Interface, i int) (d Device, h nvml.Device, missing []string, err error) {
	d = Device{Index: i, UUID: fmt.Sprintf("GPU-unknown-%d", i), Name: "unknown", NUMANode: -1}
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, nil, nil, nvmlErr("device handle", ret)
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = uuid
	} else {
		return d, nil, nil, nvmlErr("UUID", ret)
	}
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	} else {
		return d, nil, nil, nvmlErr("name", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, nil, nil, nvmlErr("memory info", ret)
	}
	d.MemoryTotalMiB = mem.Total / (1 << 20)
	lack := func(what string, ret nvml.Return) {
		missing = append(missing, what+": "+nvml.ErrorString(ret))
	}
	if maj, min, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		d.CCMajor, d.CCMinor = maj, min
	} else {
		lack("compute capability", ret)
	}
	if c, ret := h.GetNumGpuCores(); ret == nvml.SUCCESS {
		d.Cores = c
	} else {
		lack("cores", ret)
	}
	if c, ret := h.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		d.MaxSMClockMHz = int(c)
	} else {
		lack("max SM clock", ret)
	}
	if c, ret := h.GetMaxClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		d.MemoryClockMHz = int(c)
	} else {
		lack("max memory clock", ret)
	}
	if w, ret := h.GetMemoryBusWidth(); ret == nvml.SUCCESS {
		d.MemoryBusWidthBit = int(w)
	} else {
		lack("memory bus width", ret)
	}
	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		d.NUMANode = numaNode(sysfsPCI, pci)
	}
	return d, h, missing, nil
}

// OnFault sets what to call after a critical Xid event failed a GPU.
func (b *NVML) OnFault(f func()) { b.onFault.Store(&f) }

// Simulator is nil: real GPUs are not set from outside.
func (b *NVML) Simulator() Simulator { return nil }

func (b *NVML) Backend() string   { return api.BackendNVML }
func (b *NVML) Devices() []Device { return append([]Device(nil), b.devices...) }

// Close stops the Xid watcher, frees its event set and shuts NVML down. The
// set is freed only once the watcher has returned from its last wait.
func (b *NVML) Close() error {
	b.closeOnce.Do(func() {
		if b.events != nil {
			close(b.stop)
			<-b.done
			if ret := b.events.Free(); ret != nvml.SUCCESS {
				b.log.Warn("freeing the Xid event set failed", "err", nvmlErr("event set free", ret))
			}
		}
		for _, m := range b.util {
			m.free()
		}
		if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
			b.closeErr = nvmlErr("shutdown", ret)
		}
	})
	return b.closeErr
}

// Sample reads utilization and memory in use; load is not needed for real GPUs.
// A GPU with a latched critical Xid is failed whatever it reads.
func (b *NVML) Sample(index int, _ Load) Sample {
	s := b.read(index)
	b.faults.apply(index, &s)
	return s
}

// ClearXid clears the critical Xid latched on a GPU.
func (b *NVML) ClearXid(index int) uint64 { return b.faults.clear(index) }

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
