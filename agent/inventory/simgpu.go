package inventory

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gpulet/gpulet/api"
)

// Sim is the simulated backend. It behaves as an H100 under MPS did: its SM
// utilization follows the units in use, while the time in which any kernel
// runs is 100% as soon as one process holds units; every client is a process
// on the GPU using its share of the memory; and each MPS instance has a
// server of one uid that stays up idle after its last client, until a client
// of another uid replaces it. Root may override what a GPU reports through
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
	return s
}

func (s *Sim) Backend() string   { return api.BackendSimulated }
func (s *Sim) Devices() []Device { return append([]Device(nil), s.devices...) }
func (s *Sim) Close() error      { return nil }

// simBusyShare is the part of its units' share that a simulated job keeps busy:
// jobs seldom use all they hold, and a full GPU that read 100% would sit above
// --max-utilization before its last units were leased.
const simBusyShare = 75

// Sample reports, unless overridden, SM utilization and memory in proportion
// to the units in use, kernel time 100% while any unit is, and the clients
// as processes. A GPU with a latched critical Xid is failed.
func (s *Sim) Sample(index int, load Load) Sample {
	smp := s.read(index, load)
	s.faults.apply(index, &smp)
	return smp
}

// ClearXid clears the critical Xid latched on a GPU.
func (s *Sim) ClearXid(index int) uint64 { return s.faults.clear(index) }

func (s *Sim) read(index int, load Load) Sample {
	d := s.devices[index]
	smp := Sample{UtilizationSource: api.UtilSourceSimulated}
	if load.UnitsTotal > 0 {
		smp.UtilizationPct = simBusyShare * load.UnitsUsed / load.UnitsTotal
		smp.MemoryUsedMiB = d.MemoryTotalMiB * uint64(load.UnitsUsed) / uint64(load.UnitsTotal)
	}
	if load.UnitsUsed > 0 {
		smp.KernelTimePct = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	served := load.Clients
	if load.MPS {
		served = s.serveLocked(index, load.Clients)
	}
	smp.SMByPID = map[int]int{}
	known := map[int]bool{}
	var extra int64
	// A process holding several leases is one process on the GPU, using
	// the sum of their shares.
	share, units, whole := map[int]uint64{}, map[int]int{}, map[int]bool{}
	for _, c := range served {
		whole[c.PID] = whole[c.PID] || c.Whole
		if !known[c.PID] {
			known[c.PID] = true
			smp.Processes = append(smp.Processes, Process{PID: c.PID})
		}
		share[c.PID] += c.ShareMiB
		units[c.PID] += c.Units
	}
	for i := range smp.Processes {
		p := &smp.Processes[i]
		p.MemoryUsedMiB = share[p.PID]
		if m, ok := s.procMiB[index][p.PID]; ok {
			p.MemoryUsedMiB = m
			extra += int64(m) - int64(share[p.PID])
		}
		if (!load.MPS || whole[p.PID]) && load.UnitsTotal > 0 {
			smp.SMByPID[p.PID] = simBusyShare * units[p.PID] / load.UnitsTotal
		}
	}
	if load.MPS && load.UnitsTotal > 0 {
		for k, srv := range s.servers[index] {
			units := 0
			for _, c := range served {
				if c.Instance == k && !c.Whole {
					units += c.Units
				}
			}
			smp.SMByPID[srv.pid] = simBusyShare * units / load.UnitsTotal
		}
	}
	for pid, m := range s.procMiB[index] {
		if !known[pid] {
			smp.Processes = append(smp.Processes, Process{PID: pid, MemoryUsedMiB: m})
			extra += int64(m)
		}
	}
	slices.SortFunc(smp.Processes, func(a, b Process) int { return a.PID - b.PID })
	smp.MemoryUsedMiB = uint64(min(max(int64(smp.MemoryUsedMiB)+extra, 0), int64(d.MemoryTotalMiB)))
	o, ok := s.overrides[index]
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
		return api.Errorf(api.ErrNotFound, "no simulated GPU with index %d (there are %d)", index, len(s.devices))
	}
	if u.UtilizationPct == nil && u.State == nil && u.MemoryUsedMiB == nil && u.Xid == nil && !u.Reset && u.Process == nil {
		return api.Errorf(api.ErrBadRequest, "nothing to set: give utilization_pct, state, memory_used_mib, xid, process or reset")
	}
	if u.Xid != nil && *u.Xid == 0 {
		return api.Errorf(api.ErrBadRequest, "xid must be an Xid number, at least 1")
	}
	if u.UtilizationPct != nil && (*u.UtilizationPct < 0 || *u.UtilizationPct > 100) {
		return api.Errorf(api.ErrBadRequest, "utilization_pct must be between 0 and 100, got %d", *u.UtilizationPct)
	}
	total := s.devices[index].MemoryTotalMiB
	if u.MemoryUsedMiB != nil && *u.MemoryUsedMiB > total {
		return api.Errorf(api.ErrBadRequest, "memory_used_mib %d is above the GPU's %d MiB", *u.MemoryUsedMiB, total)
	}
	if p := u.Process; p != nil {
		switch {
		case p.PID <= 0 || p.PID >= firstSimServerPID:
			return api.Errorf(api.ErrBadRequest, "process.pid must be a pid from 1 to %d, got %d", firstSimServerPID-1, p.PID)
		case p.Gone == (p.MemoryUsedMiB != nil):
			return api.Errorf(api.ErrBadRequest, "process needs either memory_used_mib or \"gone\": true")
		case p.MemoryUsedMiB != nil && *p.MemoryUsedMiB > total:
			return api.Errorf(api.ErrBadRequest, "process.memory_used_mib %d is above the GPU's %d MiB", *p.MemoryUsedMiB, total)
		}
	}
	if u.State != nil && !slices.Contains(SimStates, *u.State) {
		return api.Errorf(api.ErrBadRequest, "state must be one of %s, got %q", strings.Join(SimStates, ", "), *u.State)
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
