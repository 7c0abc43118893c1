package inventory

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/gpulet/gpulet/api"
)

// Model is a GPU model the simulated backend can present, with the figures the
// real card reports through NVML, so that configs written on a simulated node work
// unchanged on a real one.
type Model struct {
	Key               string // as written in --sim-gpus, e.g. "A100-80GB"
	Name              string // NVML product name
	MemoryTotalMiB    uint64
	CCMajor, CCMinor  int
	Cores             int
	MaxSMClockMHz     int
	MemoryBusWidthBit int
	MemoryClockMHz    int
}

// Models are the simulated backend's models, from the cards' public data sheets.
var Models = []Model{
	{"T4-16GB", "Tesla T4", 15360, 7, 5, 2560, 1590, 256, 5001},
	{"V100-32GB", "Tesla V100-SXM2-32GB", 32768, 7, 0, 5120, 1530, 4096, 877},
	{"A10-24GB", "NVIDIA A10", 23028, 8, 6, 9216, 1695, 384, 6251},
	{"L4-24GB", "NVIDIA L4", 23034, 8, 9, 7424, 2040, 192, 6251},
	{"A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 8, 0, 6912, 1410, 5120, 1215},
	{"A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 8, 0, 6912, 1410, 5120, 1593},
	{"H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 9, 0, 16896, 1980, 5120, 2619},
}

// maxSimGPUs bounds a spec so that a typo such as 1000xT4 fails clearly.
const maxSimGPUs = 64

// ModelKeys lists the accepted model names of --sim-gpus.
func ModelKeys() []string {
	keys := make([]string, 0, len(Models))
	for _, m := range Models {
		keys = append(keys, m.Key)
	}
	return keys
}

func findModel(key string) (Model, bool) {
	m, found := matchModels(key)
	if len(found) == 1 {
		return found[0], true
	}
	return m, false
}

// matchModels finds the models a key names: the one of that exact key, or
// those whose key without the memory suffix it is.
func matchModels(key string) (Model, []Model) {
	for _, m := range Models {
		if strings.EqualFold(m.Key, key) {
			return m, []Model{m}
		}
	}
	// The memory suffix may be left out where only one size exists (T4, A10, ...).
	var found []Model
	for _, m := range Models {
		short, _, _ := strings.Cut(m.Key, "-")
		if strings.EqualFold(short, key) {
			found = append(found, m)
		}
	}
	return Model{}, found
}

// ParseSimSpec parses a --sim-gpus value: comma-separated COUNTxMODEL items (the
// COUNTx part may be left out for one GPU), e.g. "2xA100-80GB,1xT4-16GB".
func ParseSimSpec(spec string) ([]Model, error) {
	usage := fmt.Sprintf("accepted forms: COUNTxMODEL[,COUNTxMODEL...] such as 2xA100-80GB,1xT4-16GB; models: %s",
		strings.Join(ModelKeys(), ", "))
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("--sim-gpus is empty; %s", usage)
	}
	var out []Model
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		count, key := 1, item
		if n, rest, ok := strings.Cut(item, "x"); ok && n != "" && isDigits(n) {
			c, err := strconv.Atoi(n)
			if err != nil || c < 1 {
				return nil, fmt.Errorf("--sim-gpus item %q: count must be a whole number of at least 1; %s", item, usage)
			}
			count, key = c, rest
		}
		m, ok := findModel(key)
		if !ok {
			if _, found := matchModels(key); len(found) > 1 {
				keys := make([]string, len(found))
				for i, f := range found {
					keys[i] = f.Key
				}
				return nil, fmt.Errorf("--sim-gpus item %q: model %q is ambiguous: say which of %s; %s", item, key, strings.Join(keys, ", "), usage)
			}
			return nil, fmt.Errorf("--sim-gpus item %q: unknown model %q; %s", item, key, usage)
		}
		if count > maxSimGPUs || len(out)+count > maxSimGPUs {
			return nil, fmt.Errorf("--sim-gpus %q: more than %d GPUs; %s", spec, maxSimGPUs, usage)
		}
		for i := 0; i < count; i++ {
			out = append(out, m)
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// SimUUID is the stable UUID of simulated GPU index on node: a restarted daemon
// sees the same GPUs, and two simulated nodes never share one.
func SimUUID(node string, index int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("gpulet-sim/%s/%d", node, index)))
	x := fmt.Sprintf("%x", h[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// Sim is the simulated backend. Its utilization and memory follow the units in
// use unless overridden through Set; an Xid given to Set is treated as NVML's
// Xid events are.
type Sim struct {
	devices []Device
	faults  *xidFaults

	mu sync.Mutex // guards overrides
	// overrides holds what Set fixed per GPU index.
	overrides map[int]api.SimGPUUpdate
}

// NewSim builds the simulated backend for node from parsed models.
func NewSim(node string, models []Model) *Sim {
	s := &Sim{overrides: map[int]api.SimGPUUpdate{}, faults: newXidFaults(len(models))}
	for i, m := range models {
		s.devices = append(s.devices, Device{
			Index: i, UUID: SimUUID(node, i), Name: m.Name, MemoryTotalMiB: m.MemoryTotalMiB,
			CCMajor: m.CCMajor, CCMinor: m.CCMinor, Cores: m.Cores, MaxSMClockMHz: m.MaxSMClockMHz,
			MemoryBusWidthBit: m.MemoryBusWidthBit, MemoryClockMHz: m.MemoryClockMHz,
			// Node 0 is on every host: a simulated node in a Kubernetes
			// cluster gives the kubelet a hint that can always be met.
			NUMANode: 0,
		})
	}
	return s
}

func (s *Sim) Backend() string   { return api.BackendSimulated }
func (s *Sim) Devices() []Device { return append([]Device(nil), s.devices...) }
func (s *Sim) Close() error      { return nil }

// simBusyShare is the part of its units' share that a simulated job keeps busy:
// jobs seldom use all they hold, and a full GPU that read 100% would sit above
// --max-utilization before its last units were leased.
const simBusyShare = 75

// Sample reports, unless overridden, utilization and memory in proportion to the
// units in use. A GPU with a latched critical Xid is failed.
func (s *Sim) Sample(index int, load Load) Sample {
	smp := s.read(index, load)
	s.faults.apply(index, &smp)
	return smp
}

// ClearXid clears the critical Xid latched on a GPU.
func (s *Sim) ClearXid(index int) uint64 { return s.faults.clear(index) }

func (s *Sim) read(index int, load Load) Sample {
	d := s.devices[index]
	var smp Sample
	if load.UnitsTotal > 0 {
		smp.UtilizationPct = simBusyShare * load.UnitsUsed / load.UnitsTotal
		smp.MemoryUsedMiB = d.MemoryTotalMiB * uint64(load.UnitsUsed) / uint64(load.UnitsTotal)
	}
	s.mu.Lock()
	o, ok := s.overrides[index]
	s.mu.Unlock()
	if !ok {
		return smp
	}
	if o.UtilizationPct != nil {
		smp.UtilizationPct = *o.UtilizationPct
	}
	if o.MemoryUsedMiB != nil {
		smp.MemoryUsedMiB = *o.MemoryUsedMiB
	}
	if o.State != nil && *o.State == api.GPUFailed {
		smp.Err = fmt.Errorf("simulated failure")
	}
	return smp
}

// SimStates are the states Set accepts.
var SimStates = []string{api.GPUWorking, api.GPUFailed}

// Set fixes what GPU index reports from now on. It validates the whole update
// before applying any of it.
func (s *Sim) Set(index int, u api.SimGPUUpdate) error {
	if index < 0 || index >= len(s.devices) {
		return api.Errorf(api.ErrNotFound, "no simulated GPU with index %d (there are %d)", index, len(s.devices))
	}
	if u.UtilizationPct == nil && u.State == nil && u.MemoryUsedMiB == nil && u.Xid == nil && !u.Reset {
		return api.Errorf(api.ErrBadRequest, "nothing to set: give utilization_pct, state, memory_used_mib, xid or reset")
	}
	if u.Xid != nil && *u.Xid == 0 {
		return api.Errorf(api.ErrBadRequest, "xid must be an Xid number, at least 1")
	}
	if u.UtilizationPct != nil && (*u.UtilizationPct < 0 || *u.UtilizationPct > 100) {
		return api.Errorf(api.ErrBadRequest, "utilization_pct must be between 0 and 100, got %d", *u.UtilizationPct)
	}
	if u.MemoryUsedMiB != nil && *u.MemoryUsedMiB > s.devices[index].MemoryTotalMiB {
		return api.Errorf(api.ErrBadRequest, "memory_used_mib %d is above the GPU's %d MiB", *u.MemoryUsedMiB, s.devices[index].MemoryTotalMiB)
	}
	if u.State != nil {
		ok := false
		for _, st := range SimStates {
			ok = ok || *u.State == st
		}
		if !ok {
			return api.Errorf(api.ErrBadRequest, "state must be one of %s, got %q", strings.Join(SimStates, ", "), *u.State)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overrides[index]
	if u.Reset {
		o = api.SimGPUUpdate{}
	}
	if u.UtilizationPct != nil {
		o.UtilizationPct = u.UtilizationPct
	}
	if u.MemoryUsedMiB != nil {
		o.MemoryUsedMiB = u.MemoryUsedMiB
	}
	if u.State != nil {
		o.State = u.State
	}
	s.overrides[index] = o
	// An Xid is an event, not a setting: it is latched like NVML's (an
	// application Xid is not), and only ClearXid or a restart undoes it.
	if u.Xid != nil {
		s.faults.record(index, *u.Xid)
	}
	return nil
}
