// Package api holds gpulet's wire types: the snapshot, GPUs, leases, requests and
// the error vocabulary shared by the daemon and its clients, and what a
// request's gpu and type fields match, which the daemon's placement, the
// collector and gpurun --offline must read alike. It has no dependencies
// beyond the standard library so that users' programs can import it cheaply.
package api

import "time"

// DefaultSocket is where gpuletd listens and its clients look, unless told
// otherwise (docs/design.md §6).
const DefaultSocket = "/run/gpulet/gpulet.sock"

// MaxSocketPath is the longest path a Unix socket may have: sun_path holds
// 108 bytes, the last a NUL. gpuletd and its clients check it up front, so
// that the kernel's "invalid argument" is never what a user reads.
const MaxSocketPath = 107

// SnapshotSchema names the snapshot format; a receiver checks it before use.
const SnapshotSchema = "gpulet.snapshot/v1"

// Node states. A degraded node grants no leases because of a fault of its own
// (it cannot record leases); Snapshot.Reason says why.
const (
	NodeWorking  = "working"
	NodeDraining = "draining"
	NodeDegraded = "degraded"
)

// GPU states.
const (
	GPUWorking  = "working"
	GPUDegraded = "degraded"
	GPUFailed   = "failed"
)

// MPS instance states.
const (
	InstanceStarting = "starting"
	InstanceRunning  = "running"
	InstanceDown     = "down"
	InstanceOff      = "off"
)

// InstanceTakesLeases says whether an MPS instance in state may take new
// leases: one that runs, or any when MPS is off.
func InstanceTakesLeases(state string) bool { return state == InstanceRunning || state == InstanceOff }

// Backend names as the snapshot reports them.
const (
	BackendNVML      = "nvml"
	BackendSimulated = "simulated"
)

// SnapshotNewer reports whether the snapshot of (boot, seq) comes after the
// one of (lastBoot, lastSeq): a snapshot of another daemon run does (its seq
// starts again from 1), and within one run a higher seq does. Receivers
// apply snapshots by this one rule.
func SnapshotNewer(boot string, seq uint64, lastBoot string, lastSeq uint64) bool {
	return boot != lastBoot || seq > lastSeq
}

// Snapshot is the node's state at one moment (docs/design.md §8). A published
// snapshot is immutable: readers share it and must not modify it.
type Snapshot struct {
	Schema  string    `json:"schema"`
	Node    string    `json:"node"`
	BootID  string    `json:"boot_id"`
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	State   string    `json:"state"`
	Backend string    `json:"backend"`
	MPS     string    `json:"mps"`
	// Version and Commit are the gpuletd that made the snapshot: its module
	// version and commit, from the binary's build info ("unknown" where the
	// build recorded none).
	Version       string `json:"version"`
	Commit        string `json:"commit"`
	UnitsTotal    int    `json:"units_total"`
	UnitsFree     int    `json:"units_free"`
	UnitsReserved int    `json:"units_reserved"`
	GPUs          []GPU  `json:"gpus"`
	// View says whether the FUSE view is mounted; absent when none was asked for.
	View *ViewStatus `json:"view,omitempty"`
	// Reason says why the node is degraded; absent otherwise.
	Reason string `json:"reason,omitempty"`
	// Upstreams is how pushing to each --upstream goes, as of this
	// snapshot's making; absent when none is configured.
	Upstreams []UpstreamStatus `json:"upstreams,omitempty"`
	// Reservations are the workflow reservations, by name; absent when
	// there are none.
	Reservations []ReservationStatus `json:"reservations,omitempty"`
	// OverQuota are the quotas held above their limit (offline claims, a
	// lowered quota, reservations); absent when none is.
	OverQuota []QuotaOver `json:"over_quota,omitempty"`
	// ConfigError says why the last SIGHUP reload of --config failed (the
	// config read before stays in force); absent when none failed since.
	ConfigError string `json:"config_error,omitempty"`
}

// UpstreamStatus is how pushing snapshots to one upstream goes.
type UpstreamStatus struct {
	URL string `json:"url"`
	// LastSuccess is when a push last succeeded, and LastSeq the seq it
	// carried; absent before the first.
	LastSuccess *time.Time `json:"last_success,omitempty"`
	LastSeq     uint64     `json:"last_seq,omitempty"`
	// LastError says why the last push failed, while pushes fail; Failures
	// counts the failures in a row.
	LastError string `json:"last_error,omitempty"`
	Failures  int    `json:"failures"`
	// Pushes counts the successful pushes since gpuletd started.
	Pushes uint64 `json:"pushes"`
}

// ViewStatus is the state of the FUSE view.
type ViewStatus struct {
	Mount   string `json:"mount"`
	Mounted bool   `json:"mounted"`
	// Error says why the view is not mounted.
	Error string `json:"error,omitempty"`
}

// GPU is one GPU as the snapshot shows it.
type GPU struct {
	Index         int    `json:"index"`
	UUID          string `json:"uuid"`
	Name          string `json:"name"`
	State         string `json:"state"`
	Eligible      bool   `json:"eligible"`
	UnitsTotal    int    `json:"units_total"`
	UnitsUsed     int    `json:"units_used"`
	UnitsFree     int    `json:"units_free"`
	UnitsOffline  int    `json:"units_offline"`
	UnitsReserved int    `json:"units_reserved"`
	// UtilizationPct is the share of the SMs in use, the figure
	// --max-utilization compares; UtilizationSource says how it was measured
	// (UtilSource*).
	UtilizationPct    int    `json:"utilization_pct"`
	UtilizationSource string `json:"utilization_source"`
	// KernelTimePct is NVML's utilization.gpu: the share of time in which
	// any kernel ran. Shown, never compared with the threshold.
	KernelTimePct     int    `json:"kernel_time_pct"`
	MaxUtilizationPct int    `json:"max_utilization_pct"`
	MemoryTotalMiB    uint64 `json:"memory_total_mib"`
	MemoryUsedMiB     uint64 `json:"memory_used_mib"`
	// MemoryHeldMiB is the memory its leases, offline claims and reserved
	// units hold, used or not: each lease's memory_mib, else its units'
	// share; a claimed or reserved unit's share (docs/design.md §1.8).
	// Placement sees as free the memory neither held nor used by outside
	// processes.
	MemoryHeldMiB uint64     `json:"memory_held_mib"`
	Instances     []Instance `json:"instances"`
	// OutsideMemoryMiB is the GPU memory of processes on the GPU that belong
	// to no lease, no offline claim and no MPS server of gpulet's.
	OutsideMemoryMiB uint64 `json:"outside_memory_mib"`
	// OutsideProcesses lists those processes; absent when there are none.
	OutsideProcesses []GPUProcess `json:"outside_processes,omitempty"`
	// OutsideOverShare is set while the outside processes use more memory
	// than the leases and claims leave free: they eat into leased shares.
	OutsideOverShare bool `json:"outside_over_share,omitempty"`
	// LeasesOverShare counts the GPU's leases and claims whose processes
	// use more memory than their share.
	LeasesOverShare int `json:"leases_over_share,omitempty"`
	// Claims are the GPU's offline claims, one per claiming process and
	// instance, with what their processes use; absent when there are none.
	Claims []Claim `json:"claims,omitempty"`
	// OfflineByUID splits UnitsOffline by the owner of each claim's FIFO: uid
	// (decimal) → units. Absent when no unit is claimed offline.
	OfflineByUID map[string]int `json:"offline_by_uid,omitempty"`
	// Error says why a GPU is failed; empty otherwise.
	Error string `json:"error,omitempty"`
	// Xid is the critical Xid event that failed the GPU; it stays until an
	// admin clears it (POST /v1/node/undrain with {"gpu":...}) or the daemon
	// restarts. Absent when none.
	Xid uint64 `json:"xid,omitempty"`
	// Capability describes the card for placement and scoring; it does not change
	// while the daemon runs.
	Capability Capability `json:"capability"`
}

// Capability is what a GPU model can do.
// A figure NVML could not give is 0 ("0.0" for the compute capability).
type Capability struct {
	ComputeCapability string `json:"compute_capability"`
	Cores             int    `json:"cores,omitempty"`
	MaxSMClockMHz     int    `json:"max_sm_clock_mhz"`
	MemoryBusWidthBit int    `json:"memory_bus_width_bits"`
	MemoryClockMHz    int    `json:"memory_clock_mhz"`
	// MemoryBandwidthGBps is the peak memory bandwidth, derived from the bus
	// width and memory clock: bits/8 × MHz × 2 (NVML's memory clock counts
	// one edge of a double data rate), in GB/s (10^9 bytes a second).
	MemoryBandwidthGBps int `json:"memory_bandwidth_gbps"`
}

// Instance is one MPS control daemon of a GPU.
type Instance struct {
	Instance   int    `json:"instance"`
	State      string `json:"state"`
	Clients    int    `json:"clients"`
	ClientsMax int    `json:"clients_max"`
	// Units are the unit indices this instance owns.
	Units []int `json:"units"`
	// UnitsFree counts the instance's units neither used nor reserved, so
	// that a scheduler above the node (the collector's placements) can tell
	// which instance a request fits.
	UnitsFree int `json:"units_free"`
	// UID is the user whose clients the instance's MPS server serves now; absent
	// while it serves nobody (an idle server left by a finished job serves
	// nobody: the next user's client replaces it).
	UID *uint32 `json:"uid,omitempty"`
	// SMPct is the SM utilization of the instance's MPS server as NVML gives
	// it per process; absent where it is not known (MPS off, no server).
	SMPct *int `json:"sm_pct,omitempty"`
	// Servers are the instance's live MPS servers, idle ones included;
	// absent when none runs.
	Servers []MPSServer `json:"servers,omitempty"`
	// SlurmJobs are the Slurm jobs whose leases hold units of the instance,
	// ascending; absent when none does.
	SlurmJobs []uint64 `json:"slurm_jobs,omitempty"`
	// Error says why an instance is down.
	Error string `json:"error,omitempty"`
}

// LeaseGPU names the GPU of a lease.
type LeaseGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// Owner is who holds a lease, as the daemon learned it from SO_PEERCRED.
type Owner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	PID int    `json:"pid"`
	// Groups are the caller's supplementary groups when it asked: the lease
	// counts toward their quotas.
	Groups []uint32 `json:"groups,omitempty"`
}

// Lease is a grant of units on one MPS instance of one GPU.
type Lease struct {
	ID       string     `json:"id"`
	GPU      LeaseGPU   `json:"gpu"`
	Instance int        `json:"instance"`
	Units    []int      `json:"units"`
	Owner    Owner      `json:"owner"`
	Created  time.Time  `json:"created"`
	Expires  *time.Time `json:"expires,omitempty"`
	TTL      string     `json:"ttl,omitempty"`
	// Binding is what ends the lease: "pid" (its process exits), "ttl"
	// (it is not renewed in time), "pod" (the kubelet no longer lists its
	// devices as held by a pod) or "slurm" (its Slurm job, or step, leaves
	// the node).
	Binding     string            `json:"binding,omitempty"`
	Preemptible bool              `json:"preemptible"`
	Reservation string            `json:"reservation,omitempty"`
	Task        string            `json:"task,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	MemoryMiB   uint64            `json:"memory_mib,omitempty"`
	Env         map[string]string `json:"env"`
	// Pod is the Kubernetes container a lease of binding "pod" serves;
	// absent for other leases.
	Pod *LeasePod `json:"pod,omitempty"`
	// Slurm is the Slurm job a lease of binding "slurm" belongs to; absent
	// for other leases.
	Slurm *LeaseSlurm `json:"slurm,omitempty"`
	// Claim is the Kubernetes ResourceClaim share a lease of binding
	// "claim" holds for; absent for other leases.
	Claim *LeaseClaim `json:"claim,omitempty"`
	// Usage is what the lease's processes use of the GPU, as last sampled;
	// absent before the first sample that saw the lease.
	Usage *Usage `json:"usage,omitempty"`
	// GPUs lists a whole-GPU lease's GPUs in CUDA_VISIBLE_DEVICES order;
	// absent for other leases. GPU is then the first of them, Instance 0
	// and Units every unit of one GPU: the lease holds them on each.
	GPUs []LeaseGPU `json:"gpus,omitempty"`
}

// LeaseClaim is the Kubernetes side of a lease made by gpuletd's DRA driver
// (gpu.gpulet.io) for one device of a ResourceClaim, as the scheduler
// allocated it.
type LeaseClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Device is the allocated device's name in the node's ResourceSlices;
	// Share its share id, for a device that several claims share.
	Device string `json:"device"`
	Share  string `json:"share,omitempty"`
	// Pod is the pod the claim was prepared for, "<namespace>/<name>".
	Pod string `json:"pod,omitempty"`
}

// LeaseSlurm names the Slurm job (and step) of a lease, as gpuletd read it
// from the cgroup of the process that asked.
type LeaseSlurm struct {
	JobID uint64 `json:"job_id"`
	// Step is set for a lease bound to one step ("0", "batch"); empty for a
	// lease of the whole job.
	Step string `json:"step,omitempty"`
}

// SlurmScopeJob and SlurmScopeStep are the values of LeaseRequest.Slurm.
const (
	SlurmScopeJob  = "job"
	SlurmScopeStep = "step"
)

// SlurmRelease is the answer of DELETE /v1/slurm/jobs/{id}: the leases of
// the job that it ended.
type SlurmRelease struct {
	JobID    uint64   `json:"job_id"`
	Released []string `json:"released"`
}

// LeasePod is the Kubernetes side of a lease made through the kubelet's
// device-plugin API: the devices the kubelet allocated and, once the kubelet's
// pod-resources API has listed them, the container that holds them.
type LeasePod struct {
	// Devices are the kubelet's device ids of the lease's units,
	// "<gpu-uuid>-<unit>".
	Devices   []string `json:"devices"`
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name,omitempty"`
	Container string   `json:"container,omitempty"`
}

// LeaseRequest is the body of POST /v1/leases. Every field but Units is optional.
type LeaseRequest struct {
	Units int `json:"units"`
	// GPUs asks for that many whole GPUs of the node, every unit of each,
	// with no MPS client: all of them or none. Units is then absent or 0,
	// and GPU, Reservation and Preemptible are not allowed.
	GPUs      int    `json:"gpus,omitempty"`
	GPU       string `json:"gpu,omitempty"`
	Pool      string `json:"pool,omitempty"`
	Type      string `json:"type,omitempty"`
	MemoryMiB uint64 `json:"memory_mib,omitempty"`
	// MinCC is the lowest compute capability the request accepts, MAJOR.MINOR
	// such as "8.0"; empty: any.
	MinCC       string            `json:"min_cc,omitempty"`
	Task        string            `json:"task,omitempty"`
	Reservation string            `json:"reservation,omitempty"`
	TTL         string            `json:"ttl,omitempty"`
	Wait        string            `json:"wait,omitempty"`
	PID         int               `json:"pid,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Preemptible consents to borrow: when no ordinary units are free, the
	// lease may take units a reservation lends its caller, and ends (its
	// process told SIGTERM, then SIGKILL) when the reservation takes them
	// back. A lease naming the reservation consents by naming it.
	Preemptible bool `json:"preemptible,omitempty"`
	// Slurm binds the lease to the Slurm job ("job") or step ("step") that
	// the caller runs in, read from its cgroup; the owner's other live lease
	// of the same job (or step) is the answer when it has enough units.
	Slurm string `json:"slurm,omitempty"`
}

// LeaseList is the body of GET /v1/leases.
type LeaseList struct {
	Leases []Lease `json:"leases"`
}

// GPUList is the body of GET /v1/gpus.
type GPUList struct {
	Backend string `json:"backend"`
	MPS     string `json:"mps"`
	GPUs    []GPU  `json:"gpus"`
}

// SimGPUUpdate is the body of POST /v1/sim/gpus/{index}: what a simulated GPU
// reports from then on. A nil field leaves that value as it was.
type SimGPUUpdate struct {
	UtilizationPct *int    `json:"utilization_pct,omitempty"`
	State          *string `json:"state,omitempty"`
	MemoryUsedMiB  *uint64 `json:"memory_used_mib,omitempty"`
	// Xid delivers a critical Xid event, as NVML reports one: a GPU fault
	// (e.g. 79) fails the GPU until cleared; an application error (e.g. 13)
	// is logged and ignored.
	Xid *uint64 `json:"xid,omitempty"`
	// Reset drops the GPU's earlier settings first: utilization and memory
	// follow its units again and its state is working. A latched Xid stays
	// (gpulet undrain --gpu clears it).
	Reset bool `json:"reset,omitempty"`
	// Process sets what one process uses of the GPU: a leased process's
	// memory, or a process beside gpulet; with Gone, it is forgotten.
	Process *SimProcess `json:"process,omitempty"`
}

// SimProcess is a simulated process on a GPU.
type SimProcess struct {
	PID           int     `json:"pid"`
	MemoryUsedMiB *uint64 `json:"memory_used_mib,omitempty"`
	Gone          bool    `json:"gone,omitempty"`
}

// UndrainRequest is the optional body of POST /v1/node/undrain. Without a
// body the node resumes new leases; with GPU (an index or UUID) only that
// GPU's Xid fault is cleared and the node's draining is left as it is.
type UndrainRequest struct {
	GPU string `json:"gpu"`
}

// Placement is the body of POST /v1/placements: where a lease of the same
// request would go now, and why each GPU was kept or left out.
type Placement struct {
	GPU      LeaseGPU `json:"gpu"`
	Instance int      `json:"instance"`
	Units    []int    `json:"units"`
	Policy   string   `json:"policy"`
	// Reservation names the reservation the lease would draw on or borrow
	// from; Preemptible says it would borrow.
	Reservation string      `json:"reservation,omitempty"`
	Preemptible bool        `json:"preemptible,omitempty"`
	Candidates  []Candidate `json:"candidates"`
	// GPUs lists the GPUs a whole-GPU lease would take, in
	// CUDA_VISIBLE_DEVICES order; absent for other leases.
	GPUs []LeaseGPU `json:"gpus,omitempty"`
}

// Candidate is one GPU of a dry run: kept, or left out and why.
type Candidate struct {
	GPU  int    `json:"gpu"`
	Kept bool   `json:"kept"`
	Why  string `json:"why,omitempty"`
	// Score is a kept GPU's score under the score policy.
	Score *Score `json:"score,omitempty"`
}

// Score is one GPU's score for one request under the score policy
// (docs/placement.md): the card's facts normalized over the node's GPUs,
// S_card (their weighted sum), S_similarity, and their total.
type Score struct {
	CC         float64 `json:"cc"`
	Bandwidth  float64 `json:"bandwidth"`
	Clock      float64 `json:"clock"`
	Card       float64 `json:"card"`
	Similarity float64 `json:"similarity"`
	Total      float64 `json:"total"`
}
