package agent

import (
	"cmp"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/slurmjob"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/procfs"
)

// claimPIDs finds the process holding each offline claim's FIFO; nil when the
// view has no claim, so that an idle ledger costs no read of /proc/locks.
func claimPIDs(view *lease.View) map[procfs.LockedFile]int {
	if view == nil {
		return nil
	}
	for _, g := range view.GPUs {
		if len(g.Claimed) > 0 {
			held, err := procfs.FlockHolders()
			if err != nil {
				return nil
			}
			return held
		}
	}
	return nil
}

func claimPID(held map[procfs.LockedFile]int, c lease.OfflineUnit) int {
	return held[procfs.LockedFile{Major: unix.Major(c.FIFO.Dev), Minor: unix.Minor(c.FIFO.Dev), Inode: c.FIFO.Ino}]
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
func (a *Agent) loadOf(g int, view *lease.View, held map[procfs.LockedFile]int) inventory.Load {
	load := inventory.Load{UnitsTotal: a.cfg.Model.UnitsPerGPU, MPS: a.mpsOn}
	if view == nil {
		return load
	}
	gv := view.GPUs[g]
	load.UnitsUsed = gv.Used
	for _, l := range gv.Leases {
		if l.Owner.PID > 0 && l.Binding == string(lease.KindPID) {
			load.Clients = append(load.Clients, inventory.Client{PID: l.Owner.PID, UID: l.Owner.UID, Instance: l.Instance,
				Units: len(l.Units), ShareMiB: a.shareMiB(g, len(l.Units), l.MemoryMiB)})
		}
	}
	for _, c := range groupClaims(g, gv.Claimed, held) {
		if c.PID > 0 {
			load.Clients = append(load.Clients, inventory.Client{PID: c.PID, UID: c.UID, Instance: c.Instance,
				Units: len(c.Units), ShareMiB: a.shareMiB(g, len(c.Units), 0)})
		}
	}
	// In a stable order, so that the simulated servers' uids do not depend
	// on the order of a map.
	slices.SortFunc(load.Clients, func(x, y inventory.Client) int { return cmp.Compare(x.PID, y.PID) })
	return load
}

// groupClaims groups GPU g's claimed units by instance, owner and process.
func groupClaims(g int, units []lease.OfflineUnit, held map[procfs.LockedFile]int) []usage.Claim {
	var out []usage.Claim
	for _, u := range units {
		pid := claimPID(held, u)
		i := slices.IndexFunc(out, func(c usage.Claim) bool { return c.Instance == u.Instance && c.UID == u.UID && c.PID == pid })
		if i < 0 {
			out = append(out, usage.Claim{GPU: g, Instance: u.Instance, UID: u.UID, PID: pid})
			i = len(out) - 1
		}
		out[i].Units = append(out[i].Units, u.Unit)
	}
	return out
}

// account attributes one round of samples to leases, claims, gpulet's MPS
// servers and the processes beside them.
func (a *Agent) account(view *lease.View, samples []inventory.Sample, held map[procfs.LockedFile]int) {
	if a.usage == nil || view == nil {
		return
	}
	in := usage.Input{Now: time.Now().UTC(), Processes: make([][]inventory.Process, len(samples)), MemoryTotalMiB: make([]uint64, len(a.devs)),
		Parent: parentOf, JobOf: slurmJobOf}
	for g, d := range a.devs {
		in.Processes[g] = samples[g].Processes
		in.MemoryTotalMiB[g] = d.MemoryTotalMiB
		for _, l := range view.GPUs[g].Leases {
			pid := 0
			if l.Binding == string(lease.KindPID) {
				pid = l.Owner.PID
			}
			ul := usage.Lease{ID: l.ID, GPU: g, UID: l.Owner.UID, PID: pid, ShareMiB: a.shareMiB(g, len(l.Units), l.MemoryMiB)}
			if l.Slurm != nil {
				ul.SlurmJob = l.Slurm.JobID
			}
			in.Leases = append(in.Leases, ul)
		}
		for _, c := range groupClaims(g, view.GPUs[g].Claimed, held) {
			c.ShareMiB = a.shareMiB(g, len(c.Units), 0)
			in.Claims = append(in.Claims, c)
		}
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

// peakMiB is the most memory lease id's processes used, for its end's log
// line and journal record.
func (a *Agent) peakMiB(id string) (uint64, bool) {
	if a.usage == nil {
		return 0, false
	}
	return a.usage.Peak(id)
}
