package inventory

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/pipefile"
)

// Sim is the simulated backend. It behaves as an H100 under MPS did
// (docs/hardware.md): its SM utilization is the SMs its busy jobs may use,
// while the time in which any kernel runs is 100% as soon as one process
// holds units; every client is a process on the GPU, using its share of the
// memory; and each MPS instance has a server of one uid, a GPU process with
// memory of its own, that stays up idle after its last client, until a
// client of another uid replaces it. Root may override what a GPU reports through
// Set; an Xid given to Set is treated as NVML's Xid events are.
type Sim struct {
	devices []Device
	faults  *xidFaults

	mu sync.Mutex // guards what follows
	// overrides holds what Set fixed per GPU index.
	overrides map[int]api.SimGPUUpdate
	// procMiB holds, per GPU, the memory Set gave processes by pid.
	procMiB []map[int]uint64
	// servers holds, per GPU and instance, the simulated MPS server.
	servers []map[int]*simServer
	// rounds counts each GPU's samples, and smByPID holds the per-process
	// SM figures last read.
	rounds  []int
	smByPID []map[int]int
	// serverUIDs maps every simulated server pid to its uid.
	serverUIDs map[int]uint32
	nextPID    int
}

// simServer is a simulated MPS server: one uid, its clients' pids.
type simServer struct {
	pid     int
	uid     uint32
	clients []int
}

// firstSimServerPID is above the kernel's largest pid (4194304), so that a
// simulated server is never taken for a real process.
const firstSimServerPID = 1 << 22

// NewSim builds the simulated backend for node from parsed models.
func NewSim(node string, models []Model) *Sim {
	s := &Sim{overrides: map[int]api.SimGPUUpdate{}, faults: newXidFaults(len(models)),
		serverUIDs: map[int]uint32{}, nextPID: firstSimServerPID}
	for i, m := range models {
		s.devices = append(s.devices, Device{
			Index: i, UUID: SimUUID(node, i), Name: m.Name, MemoryTotalMiB: m.MemoryTotalMiB,
			CCMajor: m.CCMajor, CCMinor: m.CCMinor, Cores: m.Cores, MaxSMClockMHz: m.MaxSMClockMHz,
			MemoryBusWidthBit: m.MemoryBusWidthBit, MemoryClockMHz: m.MemoryClockMHz,
			// Node 0 is on every host: a simulated node in a Kubernetes
			// cluster gives the kubelet a hint that can always be met.
			NUMANode: 0,
		})
		s.procMiB = append(s.procMiB, map[int]uint64{})
		s.servers = append(s.servers, map[int]*simServer{})
	}
	s.rounds, s.smByPID = make([]int, len(models)), make([]map[int]int, len(models))
	return s
}

func (s *Sim) Backend() string   { return api.BackendSimulated }
func (s *Sim) Devices() []Device { return append([]Device(nil), s.devices...) }
func (s *Sim) Close() error      { return nil }

// What the simulated GPU reads, from the H100's record (docs/hardware.md):
//   - a busy job's SM figure is the part of the SMs it may use. Under MPS that
//     is its thread percentage (pipefile.ThreadPercentage) of the SMs, rounded
//     down to whole TPCs of two SMs: 16, 32 and 66 of the H100's 132 SMs for 2,
//     4 and 8 of 16 units, which GPM read as 12.1, 24.2 and 50.0%. Without MPS
//     nothing bounds a job's SMs, and the simulated job uses its units' share.
//     A GPU whose every unit is busy reads 100%, above --max-utilization,
//     as a full H100 would.
//   - every MPS server is a GPU process of its own, with simServerMiB of
//     memory (66 MiB each on the H100), up as long as the server is.
//   - the per-process SM figures are read as gpuletd reads NVML's on a GPU
//     with GPM, every processUtilEvery samples, and each read takes
//     simProcessUtilCost, as nvmlDeviceGetProcessUtilization did.
const (
	simServerMiB       = 66
	simProcessUtilCost = 1368 * time.Microsecond
	// smsPerTPC: MPS gives a client whole TPCs, so an even number of SMs.
	smsPerTPC = 2
)

// smCount is the number of SMs of a simulated GPU: its cores over the cores
// of one SM, 64 up to compute capability 8.0 and 128 from 8.6 on.
func smCount(d Device) int {
	perSM := 64
	if d.CCMajor > 8 || (d.CCMajor == 8 && d.CCMinor >= 6) {
		perSM = 128
	}
	return max(d.Cores/perSM, smsPerTPC)
}

// jobSM is the SM figure, in percent, of a busy job on units of total units
// of a GPU with sms SMs: under MPS the whole TPCs its thread percentage
// gives it, otherwise its units' share.
func jobSM(sms, units, total int, mps bool) float64 {
	if units <= 0 || total <= 0 {
		return 0
	}
	if !mps {
		return 100 * float64(units) / float64(total)
	}
	got := sms * pipefile.ThreadPercentage(units, total) / 100
	got = min(max(got/smsPerTPC*smsPerTPC, smsPerTPC), sms)
	return 100 * float64(got) / float64(sms)
}

// Sample reports, unless overridden, the SM utilization of the units in use
// (jobSM), memory as its processes use it (a client its share, or what Set
// gave it) and the share of units no known process holds, kernel time 100%
// while any unit is,
// and the clients and MPS servers as processes. A GPU with a latched
// critical Xid is failed.
func (s *Sim) Sample(index int, load Load) Sample {
	smp, readProcessSM := s.read(index, load)
	if readProcessSM {
		time.Sleep(simProcessUtilCost)
	}
	s.faults.apply(index, &smp)
	return smp
}

// ClearXid clears the critical Xid latched on a GPU.
func (s *Sim) ClearXid(index int) uint64 { return s.faults.clear(index) }

// read samples GPU index; readProcessSM says whether it read the
// per-process SM figures anew, which the caller pays for.
func (s *Sim) read(index int, load Load) (smp Sample, readProcessSM bool) {
	d := s.devices[index]
	sms := smCount(d)
	// Its processes are always read: none is an empty list, as NVML's.
	smp = Sample{UtilizationSource: api.UtilSourceSimulated, Processes: []Process{}}
	if load.UnitsUsed > 0 {
		smp.KernelTimePct = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	served := load.Clients
	if load.MPS {
		served = s.serveLocked(index, load.Clients)
	}
	known := map[int]bool{}
	// A process holding several leases is one process on the GPU, using
	// the sum of their shares.
	share, sm, whole := map[int]uint64{}, map[int]float64{}, map[int]bool{}
	// Units held by no known process (a lease taken over the API alone)
	// are busy too, at their share; a client waiting for another uid's
	// server runs nothing.
	free := load.UnitsUsed
	for _, c := range load.Clients {
		free -= c.Units
	}
	gpuSM := jobSM(sms, max(free, 0), load.UnitsTotal, false)
	// The GPU's memory in use is what its processes use, and their share
	// for units no known process holds: so that it adds up, and no lease's
	// usage reads more than its GPU's.
	var used uint64
	if load.UnitsTotal > 0 {
		used = pipefile.MemoryShareMiB(max(free, 0), load.UnitsTotal, d.MemoryTotalMiB)
	}
	serverSM := map[int]float64{}
	for _, c := range served {
		whole[c.PID] = whole[c.PID] || c.Whole
		if !known[c.PID] {
			known[c.PID] = true
			smp.Processes = append(smp.Processes, Process{PID: c.PID})
		}
		share[c.PID] += c.ShareMiB
		f := jobSM(sms, c.Units, load.UnitsTotal, load.MPS && !c.Whole)
		sm[c.PID] += f
		gpuSM += f
		if load.MPS && !c.Whole {
			serverSM[c.Instance] += f
		}
	}
	smp.UtilizationPct = int(math.Round(min(gpuSM, 100)))
	for i := range smp.Processes {
		p := &smp.Processes[i]
		p.MemoryUsedMiB = share[p.PID]
		if m, ok := s.procMiB[index][p.PID]; ok {
			p.MemoryUsedMiB = m
		}
		used += p.MemoryUsedMiB
	}
	for pid, m := range s.procMiB[index] {
		if !known[pid] {
			smp.Processes = append(smp.Processes, Process{PID: pid, MemoryUsedMiB: m})
			used += m
		}
	}
	if load.MPS {
		for _, srv := range s.servers[index] {
			smp.Processes = append(smp.Processes, Process{PID: srv.pid, MemoryUsedMiB: simServerMiB})
			used += simServerMiB
		}
	}
	slices.SortFunc(smp.Processes, func(a, b Process) int { return a.PID - b.PID })
	smp.MemoryUsedMiB = min(used, d.MemoryTotalMiB)
	// Per-process SM figures, as gpuletd reads NVML's where GPM gives the
	// GPU's: under MPS one per server (its clients'), otherwise one per
	// process; in between, the last ones read.
	s.rounds[index]++
	if readProcessSM = s.rounds[index]%processUtilEvery == 1; readProcessSM {
		byPID := map[int]int{}
		for _, p := range smp.Processes {
			if f, ok := sm[p.PID]; ok && (!load.MPS || whole[p.PID]) {
				byPID[p.PID] = int(math.Round(f))
			}
		}
		if load.MPS {
			for k, srv := range s.servers[index] {
				byPID[srv.pid] = int(math.Round(serverSM[k]))
			}
		}
		s.smByPID[index] = byPID
	}
	smp.SMByPID = s.smByPID[index]
	o, ok := s.overrides[index]
	if !ok {
		return smp, readProcessSM
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
	return smp, readProcessSM
}

// serveLocked brings GPU index's simulated MPS servers up to date with its
// clients, as the control daemon would, and returns the clients that run:
// an instance's server serves clients of its own uid; an idle server (no
// client left) stays up until a client of another uid comes, which then
// gets a server of its own; a client of another uid than a busy server's
// waits for it to drain. A whole-GPU lease's process runs without MPS, on
// no server.
func (s *Sim) serveLocked(index int, clients []Client) []Client {
	var served []Client
	byInstance := map[int][]Client{}
	for _, c := range clients {
		if c.Whole {
			served = append(served, c)
			continue
		}
		byInstance[c.Instance] = append(byInstance[c.Instance], c)
	}
	for k, srv := range s.servers[index] {
		if _, ok := byInstance[k]; !ok {
			srv.clients = nil
		}
	}
	for k, cs := range byInstance {
		srv := s.servers[index][k]
		busy := srv != nil && slices.ContainsFunc(cs, func(c Client) bool { return c.UID == srv.uid })
		if !busy {
			if srv != nil {
				delete(s.serverUIDs, srv.pid)
			}
			srv = &simServer{pid: s.nextPID, uid: cs[0].UID}
			s.nextPID++
			s.servers[index][k] = srv
			s.serverUIDs[srv.pid] = srv.uid
		}
		srv.clients = srv.clients[:0]
		for _, c := range cs {
			if c.UID == srv.uid {
				srv.clients = append(srv.clients, c.PID)
				served = append(served, c)
			}
		}
		slices.Sort(srv.clients)
	}
	return served
}

// ServerList lists the simulated MPS servers of instance k of the GPU: at
// most one, as the control daemon's get_server_list would.
func (s *Sim) ServerList(gpuUUID string, k int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, d := range s.devices {
		if strings.EqualFold(d.UUID, gpuUUID) {
			if srv := s.servers[i][k]; srv != nil {
				return []int{srv.pid}
			}
		}
	}
	return nil
}

// ClientList lists the clients of a simulated MPS server, as the control
// daemon's get_client_list would; ok is false for a server that is gone.
func (s *Sim) ClientList(pid int) (clients []int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.servers {
		for _, srv := range g {
			if srv.pid == pid {
				return slices.Clone(srv.clients), true
			}
		}
	}
	return nil, false
}

// ServerUID is the uid of a simulated MPS server.
func (s *Sim) ServerUID(pid int) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	uid, ok := s.serverUIDs[pid]
	return uid, ok
}

// SimStates are the states Set accepts.
var SimStates = []string{api.GPUWorking, api.GPUFailed}

// Set fixes what GPU index reports from now on. It validates the whole update
// before applying any of it.
func (s *Sim) Set(index int, u api.SimGPUUpdate) error {
	if index < 0 || index >= len(s.devices) {
		return errdefs.Errorf(errdefs.ErrNotFound, "no simulated GPU with index %d (there are %d)", index, len(s.devices))
	}
	if u.UtilizationPct == nil && u.State == nil && u.MemoryUsedMiB == nil && u.Xid == nil && !u.Reset && u.Process == nil {
		return errdefs.Errorf(errdefs.ErrInvalid, "nothing to set: give utilization_pct, state, memory_used_mib, xid, process or reset")
	}
	if u.Xid != nil && *u.Xid == 0 {
		return errdefs.Errorf(errdefs.ErrInvalid, "xid must be an Xid number, at least 1")
	}
	if u.UtilizationPct != nil && (*u.UtilizationPct < 0 || *u.UtilizationPct > 100) {
		return errdefs.Errorf(errdefs.ErrInvalid, "utilization_pct must be between 0 and 100, got %d", *u.UtilizationPct)
	}
	total := s.devices[index].MemoryTotalMiB
	if u.MemoryUsedMiB != nil && *u.MemoryUsedMiB > total {
		return errdefs.Errorf(errdefs.ErrInvalid, "memory_used_mib %d is above the GPU's %d MiB", *u.MemoryUsedMiB, total)
	}
	if p := u.Process; p != nil {
		switch {
		case p.PID <= 0 || p.PID >= firstSimServerPID:
			return errdefs.Errorf(errdefs.ErrInvalid, "process.pid must be a pid from 1 to %d, got %d", firstSimServerPID-1, p.PID)
		case p.Gone == (p.MemoryUsedMiB != nil):
			return errdefs.Errorf(errdefs.ErrInvalid, "process needs either memory_used_mib or \"gone\": true")
		case p.MemoryUsedMiB != nil && *p.MemoryUsedMiB > total:
			return errdefs.Errorf(errdefs.ErrInvalid, "process.memory_used_mib %d is above the GPU's %d MiB", *p.MemoryUsedMiB, total)
		}
	}
	if u.State != nil && !slices.Contains(SimStates, *u.State) {
		return errdefs.Errorf(errdefs.ErrInvalid, "state must be one of %s, got %q", strings.Join(SimStates, ", "), *u.State)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overrides[index]
	if u.Reset {
		o = api.SimGPUUpdate{}
		clear(s.procMiB[index])
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
	if p := u.Process; p != nil {
		if p.Gone {
			delete(s.procMiB[index], p.PID)
		} else {
			s.procMiB[index][p.PID] = *p.MemoryUsedMiB
		}
	}
	// An Xid is an event, not a setting: it is latched like NVML's (an
	// application Xid is not), and only ClearXid or a restart undoes it.
	if u.Xid != nil {
		s.faults.record(index, *u.Xid)
	}
	return nil
}
