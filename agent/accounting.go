package agent

import (
	"cmp"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/slurmjob"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/procfs"
)

// claimsOf groups each GPU's claimed units by instance, owner and the
// processes holding their FIFOs, with their share of the GPU's memory: once a
// round, for the simulated backend and the accounting alike. /proc/locks is
// read only when some unit is claimed, so that an idle ledger costs nothing.
func (a *Agent) claimsOf(view *lease.View) [][]usage.Claim {
	if view == nil {
		return nil
	}
	var held map[procfs.LockedFile]int
	holders := map[procfs.File][]int{}
	// Samples from the API (a simulated GPU set, an Xid cleared) may run
	// beside the main loop's.
	a.claimHolders.mu.Lock()
	defer a.claimHolders.mu.Unlock()
	out := make([][]usage.Claim, len(view.GPUs))
	for _, gv := range view.GPUs {
		if len(gv.Claimed) > 0 && held == nil {
			// A failed read leaves every claim's process unknown (pid 0).
			held, _ = procfs.FlockHolders()
			if held == nil {
				held = map[procfs.LockedFile]int{}
			}
		}
		for _, u := range gv.Claimed {
			f := procfs.File{Dev: u.FIFO.Dev, Ino: u.FIFO.Ino}
			holders[f] = a.cheapHolders(f, held[procfs.LockedFile{Major: unix.Major(u.FIFO.Dev), Minor: unix.Minor(u.FIFO.Dev), Inode: u.FIFO.Ino}])
		}
	}
	a.findFIFOHolders(holders)
	for g, gv := range view.GPUs {
		for _, u := range gv.Claimed {
			hs := holders[procfs.File{Dev: u.FIFO.Dev, Ino: u.FIFO.Ino}]
			pid := 0
			if len(hs) > 0 {
				pid = hs[0]
			}
			k := slices.IndexFunc(out[g], func(c usage.Claim) bool { return c.Instance == u.Instance && c.UID == u.UID && c.PID == pid })
			if k < 0 {
				out[g] = append(out[g], usage.Claim{GPU: g, Instance: u.Instance, UID: u.UID, PID: pid, Holders: hs})
				k = len(out[g]) - 1
			}
			out[g][k].Units = append(out[g][k].Units, u.Unit)
		}
		for k := range out[g] {
			out[g][k].ShareMiB = a.shareMiB(g, len(out[g][k].Units), 0)
		}
	}
	return out
}

// fifoHolders are the processes last found holding each claim FIFO open.
type fifoHolders struct {
	mu   sync.Mutex // guards last, and one round's look at once
	last map[procfs.File][]int
}

// cheapHolders is who holds the claim FIFO f open, as far as a cheap look
// tells: the process /proc/locks names as having taken its lock (locked),
// when it still holds the FIFO, else the holders found last round that still
// do. /proc/locks keeps naming the process that took the lock after it has
// passed its descriptor on and exited, and then names whatever process
// reuses its pid: neither is charged. Nil: findFIFOHolders must look.
func (a *Agent) cheapHolders(f procfs.File, locked int) []int {
	under := a.ledgerRoot()
	if locked > 0 && procfs.Holds(locked, f, under) {
		return []int{locked}
	}
	var still []int
	for _, pid := range a.claimHolders.last[f] {
		if procfs.Holds(pid, f, under) {
			still = append(still, pid)
		}
	}
	return still
}

// findFIFOHolders walks every process's descriptors for the FIFOs of
// holders that cheapHolders could not tell, fills them in, and keeps all for
// the next round's cheap look. The walk costs a round only when a claimer
// handed its descriptor on since the last one.
func (a *Agent) findFIFOHolders(holders map[procfs.File][]int) {
	missing := map[procfs.File]bool{}
	for f, hs := range holders {
		if len(hs) == 0 {
			missing[f] = true
		}
	}
	if len(missing) > 0 {
		found, _ := procfs.Holders(missing, a.ledgerRoot())
		for f := range missing {
			holders[f] = found[f]
		}
	}
	a.claimHolders.last = holders
}

// ledgerRoot is the ledger's folder as descriptors' links name it: with
// symlinks in the run dir's path resolved.
func (a *Agent) ledgerRoot() string {
	root := a.ledger.Root()
	if r, err := filepath.EvalSymlinks(root); err == nil {
		return r
	}
	return root
}

// shareMiB is a lease's share of its GPU's memory: what it asked for, else
// its units' part.
func (a *Agent) shareMiB(g int, units int, asked uint64) uint64 {
	if asked > 0 {
		return asked
	}
	return a.devs[g].MemoryTotalMiB * uint64(units) / uint64(a.cfg.Model.UnitsPerGPU)
}

// loadOf is what the simulated backend derives GPU g's figures from: its
// units in use and the processes known to hold them.
func (a *Agent) loadOf(g int, view *lease.View, claims [][]usage.Claim) inventory.Load {
	load := inventory.Load{UnitsTotal: a.cfg.Model.UnitsPerGPU, MPS: a.mpsOn}
	if view == nil {
		return load
	}
	gv := view.GPUs[g]
	load.UnitsUsed = gv.Used
	for _, l := range gv.Leases {
		if l.Owner.PID > 0 && l.Binding == string(lease.KindPID) {
			// A whole-GPU lease's environment names no MPS pipe folder.
			load.Clients = append(load.Clients, inventory.Client{PID: l.Owner.PID, UID: l.Owner.UID, Instance: l.Instance,
				Units: len(l.Units), ShareMiB: a.shareMiB(g, len(l.Units), l.MemoryMiB), Whole: len(l.GPUs) > 0})
		}
	}
	for _, c := range claims[g] {
		if c.PID > 0 {
			load.Clients = append(load.Clients, inventory.Client{PID: c.PID, UID: c.UID, Instance: c.Instance,
				Units: len(c.Units), ShareMiB: c.ShareMiB})
		}
	}
	// In a stable order, so that the simulated servers' uids do not depend
	// on the order of a map.
	slices.SortFunc(load.Clients, func(x, y inventory.Client) int { return cmp.Compare(x.PID, y.PID) })
	return load
}

// account attributes one round of samples to leases, claims, gpulet's MPS
// servers and the processes beside them.
func (a *Agent) account(view *lease.View, samples []inventory.Sample, claims [][]usage.Claim) {
	if a.usage == nil || view == nil {
		return
	}
	in := usage.Input{Now: time.Now().UTC(), Processes: make([][]inventory.Process, len(samples)), MemoryTotalMiB: make([]uint64, len(a.devs)),
		Parent: parentOf, JobOf: slurmJobOf, UIDOf: uidOf}
	for g, d := range a.devs {
		in.Processes[g] = samples[g].Processes
		in.MemoryTotalMiB[g] = d.MemoryTotalMiB
		for _, l := range view.GPUs[g].Leases {
			pid := 0
			if l.Binding == string(lease.KindPID) {
				pid = l.Owner.PID
			}
			ul := usage.Lease{ID: l.ID, GPU: g, UID: l.Owner.UID, PID: pid, ShareMiB: a.shareMiB(g, len(l.Units), l.MemoryMiB), Whole: len(l.GPUs) > 0}
			if l.Slurm != nil {
				ul.SlurmJob = l.Slurm.JobID
			}
			in.Leases = append(in.Leases, ul)
		}
		in.Claims = append(in.Claims, claims[g]...)
		for _, st := range a.mps.Status(d.UUID) {
			for _, s := range st.Servers {
				in.Servers = append(in.Servers, usage.Server{GPU: g, Instance: st.Instance, PID: s.PID})
			}
		}
	}
	a.usage.Update(in)
}

// slurmJobOf is the Slurm job a process runs in, as its cgroup says.
func slurmJobOf(pid int) uint64 {
	b, err := procfs.Cgroup(pid)
	if err != nil {
		return 0
	}
	job, err := slurmjob.Parse(b)
	if err != nil {
		return 0
	}
	return job.ID
}

func uidOf(pid int) (uint32, bool) {
	uid, err := procfs.RealUID(pid)
	return uid, err == nil
}

func parentOf(pid int) int {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.PPID
}

// withUsage returns leases with the usage last measured; the leases given are
// copies of the caller's own.
func (a *Agent) withUsage(ls []api.Lease) []api.Lease {
	t := a.usageTable()
	if t == nil {
		return ls
	}
	for i := range ls {
		ls[i].Usage = t.Leases[ls[i].ID]
	}
	return ls
}

func (a *Agent) usageTable() *usage.Table {
	if a.usage == nil {
		return nil
	}
	return a.usage.Table()
}
