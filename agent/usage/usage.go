// Package usage accounts for what leases and offline claims really use of a
// GPU: it attributes every compute process NVML lists to the lease or claim
// whose process it is (or descends from), to an MPS server of gpulet's, or to
// nobody (a process beside gpulet), and keeps each lease's peak. It owns the
// attribution and the peaks; the samples come from inventory, the leases and
// claims from the lease engine's published view.
package usage

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/api"
)

// maxDepth bounds the walk from a GPU process up to the lease's process: a
// job's CUDA process sits a few levels below it (a shell, a launcher).
const maxDepth = 32

// Lease is a live lease as accounting needs it.
type Lease struct {
	ID  string
	GPU int
	UID uint32
	// PID is the process the lease is bound to; 0 for a lease bound to no
	// process (ttl, pod, slurm), whose processes cannot be told by it.
	PID int
	// SlurmJob is the Slurm job a lease of binding slurm belongs to: every
	// process of the job is the lease's. 0 for other leases.
	SlurmJob uint64
	ShareMiB uint64
	// Whole marks a lease of whole GPUs, listed once for each of its GPUs:
	// its usage is the sum over them.
	Whole bool
}

// Claim is an offline claim of units of one instance by one process.
type Claim struct {
	GPU, Instance int
	Units         []int
	UID           uint32
	// PID holds the claim's FIFOs open, the lowest pid of Holders; 0 when
	// unknown.
	PID int
	// Holders are every process holding the claim's FIFOs open: the one
	// that took the lock may have passed the descriptor on and exited (or
	// its pid been reused), and what the descriptor's holders and their
	// descendants use is the claim's. Empty: PID alone.
	Holders  []int
	ShareMiB uint64
}

// Server is an MPS server of one of gpulet's instances.
type Server struct {
	GPU, Instance, PID int
}

// Input is one round of samples and what was live then.
type Input struct {
	Now time.Time
	// Processes are each GPU's compute processes; nil for a GPU whose
	// processes could not be read.
	Processes [][]inventory.Process
	// MemoryTotalMiB is each GPU's memory.
	MemoryTotalMiB []uint64
	Leases         []Lease
	Claims         []Claim
	Servers        []Server
	// Parent is the parent of a process, 0 when unknown.
	Parent func(pid int) int
	// JobOf is the Slurm job a process runs in, 0 when none or unknown;
	// asked only of processes no pid tells, and only when a lease has a job.
	JobOf func(pid int) uint64
	// UIDOf is the real uid of a process, false when unknown; asked only of
	// processes that belong to nobody.
	UIDOf func(pid int) (uint32, bool)
}

// Table is what one round found. It is never modified once published.
type Table struct {
	// Leases maps a lease id to its usage.
	Leases map[string]*api.Usage
	// Running are the leases with a process on a GPU, by id: the few that
	// per-lease metrics are kept for.
	Running []Running
	GPUs    []GPU
}

// Running is a lease with a process on its GPU.
type Running struct {
	ID    string
	GPU   int
	UID   uint32
	Usage *api.Usage
}

// GPU is what one GPU's processes use beside the leases.
type GPU struct {
	OutsideMiB       uint64
	Outside          []api.GPUProcess
	OutsideOverShare bool
	// OverShare counts the leases and claims over their share.
	OverShare int
	Claims    []api.Claim
}

// Accountant turns rounds of samples into Tables, keeping peaks between them.
type Accountant struct {
	mu    sync.Mutex // guards peaks; one Update at a time
	peaks map[string]uint64
	table atomic.Pointer[Table]
}

// New makes an Accountant.
func New() *Accountant { return &Accountant{peaks: map[string]uint64{}} }

// Table is the last round's table; nil before the first.
func (a *Accountant) Table() *Table { return a.table.Load() }

// Peak is the most memory lease id's processes have used, as of the last
// round; false for a lease no round saw. It takes no lock: the lease engine
// asks it under its own.
func (a *Accountant) Peak(id string) (uint64, bool) {
	t := a.table.Load()
	if t == nil {
		return 0, false
	}
	u, ok := t.Leases[id]
	if !ok {
		return 0, false
	}
	return u.MemoryPeakMiB, true
}

// owner is what a process is attributed to.
type owner struct {
	lease  int // index in Input.Leases, or -1
	claim  int // index in Input.Claims, or -1
	server bool
}

// Update attributes one round and publishes its table.
func (a *Accountant) Update(in Input) *Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &Table{Leases: make(map[string]*api.Usage, len(in.Leases)), GPUs: make([]GPU, len(in.Processes))}
	type key struct{ gpu, pid int }
	byPID := map[key]owner{}
	for i, l := range in.Leases {
		if l.PID > 0 {
			// A process holding several leases of one GPU: the first by id
			// is charged, so that its memory is counted once.
			if o, ok := byPID[key{l.GPU, l.PID}]; !ok || in.Leases[o.lease].ID > l.ID {
				byPID[key{l.GPU, l.PID}] = owner{lease: i, claim: -1}
			}
		}
	}
	for i, c := range in.Claims {
		holders := c.Holders
		if len(holders) == 0 {
			holders = []int{c.PID}
		}
		for _, pid := range holders {
			if _, ok := byPID[key{c.GPU, pid}]; pid > 0 && !ok {
				byPID[key{c.GPU, pid}] = owner{lease: -1, claim: i}
			}
		}
	}
	for _, s := range in.Servers {
		byPID[key{s.GPU, s.PID}] = owner{lease: -1, claim: -1, server: true}
	}
	type jobKey struct {
		gpu int
		job uint64
	}
	byJob := map[jobKey]int{}
	for i, l := range in.Leases {
		if _, ok := byJob[jobKey{l.GPU, l.SlurmJob}]; l.SlurmJob != 0 && !ok {
			byJob[jobKey{l.GPU, l.SlurmJob}] = i
		}
	}
	parents := map[int]int{}
	parent := func(pid int) int {
		if p, ok := parents[pid]; ok {
			return p
		}
		p := 0
		if in.Parent != nil {
			p = in.Parent(pid)
		}
		parents[pid] = p
		return p
	}
	leaseUse := make([]api.Usage, len(in.Leases))
	claimUse := make([]api.Usage, len(in.Claims))
	for g, procs := range in.Processes {
		for _, p := range procs {
			o, found := owner{}, false
			for pid, depth := p.PID, 0; pid > 1 && depth < maxDepth && !found; pid, depth = parent(pid), depth+1 {
				o, found = byPID[key{g, pid}]
			}
			if !found && len(byJob) > 0 && in.JobOf != nil {
				if i, ok := byJob[jobKey{g, in.JobOf(p.PID)}]; ok {
					o, found = owner{lease: i, claim: -1}, true
				}
			}
			switch {
			case !found:
				t.GPUs[g].OutsideMiB += p.MemoryUsedMiB
				gp := api.GPUProcess{PID: p.PID, MemoryUsedMiB: p.MemoryUsedMiB}
				if in.UIDOf != nil {
					if uid, ok := in.UIDOf(p.PID); ok {
						gp.UID = &uid
					}
				}
				t.GPUs[g].Outside = append(t.GPUs[g].Outside, gp)
			case o.lease >= 0:
				charge(&leaseUse[o.lease], p)
			case o.claim >= 0:
				charge(&claimUse[o.claim], p)
			}
		}
	}
	shares := make([]uint64, len(in.Processes))
	// Nearly every lease of a large node has no process on its GPU and never
	// had: those share one usage, and only the others get one of their own
	// (not a pointer into leaseUse, which would keep all of it).
	idle := &api.Usage{PIDs: []int{}, SampledAt: in.Now}
	wholeShares := foldWhole(in.Leases, leaseUse)
	for i, l := range in.Leases {
		if l.Whole {
			if u, done := t.Leases[l.ID]; done {
				// Another GPU of a lease already finished: its usage is
				// that one, and the GPU counts it over share with it.
				if l.GPU < len(t.GPUs) {
					shares[l.GPU] += l.ShareMiB
					t.GPUs[l.GPU].OverShare += b2i(u.OverShare)
				}
				continue
			}
		}
		u := &leaseUse[i]
		share := l.ShareMiB
		if l.Whole {
			share = wholeShares[l.ID]
		}
		a.finish(u, l.ID, share, in.Now)
		if len(u.PIDs) == 0 && u.MemoryPeakMiB == 0 {
			u = idle
		} else {
			own := *u
			u = &own
		}
		t.Leases[l.ID] = u
		if len(u.PIDs) > 0 {
			t.Running = append(t.Running, Running{ID: l.ID, GPU: l.GPU, UID: l.UID, Usage: u})
		}
		if l.GPU < len(t.GPUs) {
			shares[l.GPU] += l.ShareMiB
			t.GPUs[l.GPU].OverShare += b2i(u.OverShare)
		}
	}
	for i, c := range in.Claims {
		u := &claimUse[i]
		a.finish(u, claimKey(c), c.ShareMiB, in.Now)
		if c.GPU < len(t.GPUs) {
			shares[c.GPU] += c.ShareMiB
			t.GPUs[c.GPU].OverShare += b2i(u.OverShare)
			t.GPUs[c.GPU].Claims = append(t.GPUs[c.GPU].Claims, api.Claim{Instance: c.Instance, Units: c.Units, UID: c.UID, PID: c.PID, Usage: u})
		}
	}
	for g := range t.GPUs {
		if g < len(in.MemoryTotalMiB) {
			free := in.MemoryTotalMiB[g] - min(shares[g], in.MemoryTotalMiB[g])
			t.GPUs[g].OutsideOverShare = t.GPUs[g].OutsideMiB > free
		}
		slices.SortFunc(t.GPUs[g].Outside, func(x, y api.GPUProcess) int { return cmp.Compare(x.PID, y.PID) })
	}
	slices.SortFunc(t.Running, func(x, y Running) int { return cmp.Compare(x.ID, y.ID) })
	a.forgetEnded(in)
	a.table.Store(t)
	return t
}

// foldWhole adds the usage of each whole-GPU lease's later GPUs to the entry
// of its first, which is the one finished, and returns each such lease's
// share over all its GPUs; nil when there is none.
func foldWhole(leases []Lease, use []api.Usage) map[string]uint64 {
	var first map[string]int
	var shares map[string]uint64
	for i, l := range leases {
		if !l.Whole {
			continue
		}
		if first == nil {
			first, shares = map[string]int{}, map[string]uint64{}
		}
		shares[l.ID] += l.ShareMiB
		j, seen := first[l.ID]
		if !seen {
			first[l.ID] = i
			continue
		}
		use[j].MemoryUsedMiB += use[i].MemoryUsedMiB
		use[j].PIDs = append(use[j].PIDs, use[i].PIDs...)
	}
	return shares
}

func charge(u *api.Usage, p inventory.Process) {
	u.MemoryUsedMiB += p.MemoryUsedMiB
	u.PIDs = append(u.PIDs, p.PID)
}

// finish completes a usage: its peak, whether it is over its share, its pids
// in order.
func (a *Accountant) finish(u *api.Usage, id string, share uint64, now time.Time) {
	// A peak of 0 is not kept: most leases never run anything on the GPU.
	u.MemoryPeakMiB = max(a.peaks[id], u.MemoryUsedMiB)
	if u.MemoryPeakMiB > 0 {
		a.peaks[id] = u.MemoryPeakMiB
	}
	u.OverShare = u.MemoryUsedMiB > share
	u.SampledAt = now
	if u.PIDs == nil {
		u.PIDs = []int{}
	}
	slices.Sort(u.PIDs)
	// A process of a whole-GPU lease is listed on each GPU it uses.
	u.PIDs = slices.Compact(u.PIDs)
}

// forgetEnded drops the peaks of what is no longer live.
func (a *Accountant) forgetEnded(in Input) {
	live := make(map[string]bool, len(in.Leases)+len(in.Claims))
	for _, l := range in.Leases {
		live[l.ID] = true
	}
	for _, c := range in.Claims {
		live[claimKey(c)] = true
	}
	for id := range a.peaks {
		if !live[id] {
			delete(a.peaks, id)
		}
	}
}

// claimKey names a claim among the peaks; lease ids never start with a space.
func claimKey(c Claim) string {
	first := -1
	if len(c.Units) > 0 {
		first = c.Units[0]
	}
	return fmt.Sprintf(" %d/%d/%d/%d", c.GPU, c.Instance, c.PID, first)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
