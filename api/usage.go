package api

import "time"

// Usage is the measured use of a lease or an offline claim: the GPU memory of
// its processes (a lease's process and its descendants; a claim's process and
// its descendants), from NVML's list of compute processes.
type Usage struct {
	MemoryUsedMiB uint64 `json:"memory_used_mib"`
	// MemoryPeakMiB is the most MemoryUsedMiB has been in the lease's life.
	MemoryPeakMiB uint64 `json:"memory_peak_mib"`
	// PIDs are its processes on the GPU, ascending.
	PIDs []int `json:"pids"`
	// OverShare is set while they use more memory than the lease's share
	// (its memory_mib, else its units' part of the GPU's memory).
	OverShare bool      `json:"over_share"`
	SampledAt time.Time `json:"sampled_at"`
}

// MPSServer is a live MPS server: the user it serves, and how many clients
// it has (0: idle, kept up until a client of another user replaces it).
type MPSServer struct {
	PID     int     `json:"pid"`
	UID     *uint32 `json:"uid,omitempty"`
	Clients int     `json:"clients"`
}

// GPUProcess is a process on a GPU that is no part of gpulet's sharing.
type GPUProcess struct {
	PID int `json:"pid"`
	// UID is the process's real uid; absent when it could not be read (the
	// process exited meanwhile).
	UID           *uint32 `json:"uid,omitempty"`
	MemoryUsedMiB uint64  `json:"memory_used_mib"`
}

// Claim is what one process claimed offline, through the pipe-file ledger, of
// one MPS instance.
type Claim struct {
	Instance int    `json:"instance"`
	Units    []int  `json:"units"`
	UID      uint32 `json:"uid"`
	// PID is a process that holds the claim's FIFO open, the lowest pid of
	// them (the one that took the lock when it still does); 0 when none
	// could be told.
	PID   int    `json:"pid,omitempty"`
	Usage *Usage `json:"usage,omitempty"`
}

// Sources of a GPU's utilization_pct, the figure --max-utilization compares.
const (
	// UtilSourceGPM is NVML's GPU Performance Monitoring SM utilization
	// (Hopper and newer): the share of the SMs busy, which grows with the
	// SMs each client may use.
	UtilSourceGPM = "gpm_sm"
	// UtilSourceProcessSM is the sum of NVML's per-process SM utilization
	// (under MPS, per server), for GPUs without GPM.
	UtilSourceProcessSM = "process_sm"
	// UtilSourceDevice is NVML's utilization.gpu, the share of time in which
	// any kernel ran: the only figure some GPUs give. It reads 100 for one
	// client on a few SMs, so it never refuses a lease.
	UtilSourceDevice = "device"
	// UtilSourceSimulated is the simulated backend's SM share in use.
	UtilSourceSimulated = "simulated"
)

// UtilizationRefuses reports whether a utilization figure from source may
// keep a GPU from new leases: only a measure of the SMs in use may.
func UtilizationRefuses(source string) bool { return source != UtilSourceDevice }
