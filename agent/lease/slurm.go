package lease

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/agent/slurmjob"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/internal/procfs"
)

// This file is the Manager's side of Slurm: leases of kind slurm, which
// belong to the Slurm job (or step) their caller runs in and end when it
// leaves the node. The job is read from the caller's own cgroup, which
// slurmstepd makes as root, never from the caller's environment.

// KindSlurm: the lease ends when its Slurm job (or step) has no process left
// on the node, watched through the job's cgroup.
const KindSlurm Kind = "slurm"

// SlurmConfig is where the Manager finds Slurm's cgroups.
type SlurmConfig struct {
	// CgroupRoot is where the cgroup hierarchies are mounted; /sys/fs/cgroup
	// when empty.
	CgroupRoot string
	// Poll is how often a job's cgroup is looked at; 100ms when zero.
	Poll time.Duration
	// ReadCgroup returns /proc/<pid>/cgroup of the process that started at
	// startTime, failing when pid names another process by the end of the
	// read; the real /proc when nil.
	ReadCgroup func(pid int, startTime uint64) ([]byte, error)
}

const defaultSlurmPoll = 100 * time.Millisecond

func (c SlurmConfig) root() string {
	if c.CgroupRoot == "" {
		return "/sys/fs/cgroup"
	}
	return c.CgroupRoot
}

func (c SlurmConfig) poll() time.Duration {
	if c.Poll <= 0 {
		return defaultSlurmPoll
	}
	return c.Poll
}

// readProcCgroup is the real ReadCgroup. A live process keeps its pid, so the
// start time read again after the file shows that the file was that process's.
func readProcCgroup(pid int, startTime uint64) ([]byte, error) {
	b, err := procfs.Cgroup(pid)
	if err != nil {
		return nil, procwatch.ErrGone
	}
	if st, err := procwatch.StartTime(pid); err != nil || st != startTime {
		return nil, procwatch.ErrGone
	}
	return b, nil
}

// slurmBinding ends a lease when the job's (or step's) cgroup has no process
// left or is gone.
// SlurmJobs is the Slurm feature: leases bound to a Slurm job (or step),
// which every task and step of the job shares, ended when the job leaves the
// node or by its epilog. Its state is the table's leases of kind slurm.
type SlurmJobs struct {
	noHooks
	t slurmTable
	// processes opens a caller's process; slurm says where Slurm's cgroups
	// are (the table's Config).
	processes Processes
	slurm     SlurmConfig
}

// slurmTable is what SlurmJobs needs of the table: its lock, its live
// leases, and ending one. *Manager is the real one; the feature's tests give
// a fake.
type slurmTable interface {
	lockOpen() bool
	unlock()
	// eachLeaseLocked calls fn with every live lease, in no order, until fn
	// returns false.
	eachLeaseLocked(fn func(*lease) bool)
	dropAndRecordLocked(l *lease, reason string, force bool) error
}

// SlurmJobs is the table's Slurm feature.
func (m *Manager) SlurmJobs() *SlurmJobs { return m.slurm }

type slurmBinding struct {
	job  api.LeaseSlurm
	dir  string
	stop chan struct{}
	once sync.Once
}

func newSlurmBinding(job api.LeaseSlurm, dir string) *slurmBinding {
	return &slurmBinding{job: job, dir: dir, stop: make(chan struct{})}
}

func (b *slurmBinding) kind() Kind { return KindSlurm }

// armLocked looks at the job's cgroup every Poll, on the Manager's clock,
// until the job has no process left or the binding is released.
func (b *slurmBinding) armLocked(m *Manager, l *lease) {
	id, every := l.ID, m.cfg.Slurm.poll()
	warned := false
	var poll func()
	poll = func() {
		select {
		case <-b.stop:
			return
		default:
		}
		ended, err := slurmjob.Ended(b.dir)
		if err != nil && !warned {
			// Kept: a cgroup that cannot be read is no proof the job ended;
			// the epilog's release is the safety net.
			m.log.Warn("cannot tell whether a Slurm job has ended; its lease stays", "lease", id, "cgroup", b.dir, "err", err)
			warned = true
		}
		if ended {
			m.end(id, fmt.Sprintf("Slurm job %d left the node", b.job.JobID))
			return
		}
		m.clock.AfterFunc(every, poll)
	}
	m.clock.AfterFunc(every, poll)
}

func (b *slurmBinding) release() { b.once.Do(func() { close(b.stop) }) }

// bindingFor binds a lease to the Slurm job (or step) of the process
// that connected, read from its cgroup through the pidfd the connection gave
// (or, on kernels without SO_PEERPIDFD, a process of the caller's user with
// its pid).
func (sj *SlurmJobs) bindingFor(peer identity.Peer, scope string) (binding, error) {
	var p Process
	var st uint64
	var err error
	if peer.PIDFD != nil {
		p, st, err = sj.processes.Adopt(peer.PIDFD, peer.PID)
	} else {
		p, st, err = sj.processes.OpenOwned(peer.PID, peer.UID)
	}
	if err != nil {
		return nil, pidError(peer.PID, false, false, err)
	}
	p.Close()
	read := sj.slurm.ReadCgroup
	if read == nil {
		read = readProcCgroup
	}
	b, err := read(peer.PID, st)
	if err != nil {
		return nil, pidError(peer.PID, false, false, err)
	}
	job, err := slurmjob.Parse(b)
	if errors.Is(err, slurmjob.ErrNoJob) {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "slurm: process %d runs in no Slurm job's cgroup (run it under srun or sbatch, with ProctrackType=proctrack/cgroup)", peer.PID)
	}
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "slurm: the cgroup of process %d: %v", peer.PID, err)
	}
	if job.UID >= 0 && uint32(job.UID) != peer.UID && peer.UID != 0 {
		return nil, errdefs.Errorf(errdefs.ErrPermission, "slurm: job %d is uid %d's, not yours", job.ID, job.UID)
	}
	root := sj.slurm.root()
	ls, dir := api.LeaseSlurm{JobID: job.ID}, job.Dir(root)
	if scope == api.SlurmScopeStep {
		if job.Step == "" {
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "slurm: process %d is in job %d but in none of its steps", peer.PID, job.ID)
		}
		ls.Step, dir = job.Step, job.StepDir(root)
	}
	if err := slurmjob.CheckMadeBySlurm(dir); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "slurm: the cgroup of job %d: %v", job.ID, err)
	}
	return newSlurmBinding(ls, dir), nil
}

// answerLocked answers a Slurm request with the lease its job (or step)
// holds already, when it is the caller's and has units enough: every task
// and step of a job asks, and the job holds one lease. found is false when
// there is none.
func (sj *SlurmJobs) answerLocked(peer identity.Peer, req Request, bind binding) (g Grant, found bool, err error) {
	sb, ok := bind.(*slurmBinding)
	if !ok {
		return Grant{}, false, nil
	}
	var held *lease
	sj.t.eachLeaseLocked(func(l *lease) bool {
		if l.Slurm != nil && *l.Slurm == sb.job && l.Owner.UID == peer.UID {
			held = l
		}
		return held == nil
	})
	switch {
	case held == nil:
		return Grant{}, false, nil
	case (req.GPUs > 0) != (len(held.GPUs) > 0) || len(held.GPUs) < req.GPUs:
		return Grant{}, true, errdefs.Errorf(errdefs.ErrConflict, "slurm: job %d holds lease %s of %d whole GPU(s) already; %d asked", sb.job.JobID, held.ID, len(held.GPUs), req.GPUs)
	case len(held.Units) < req.Units:
		return Grant{}, true, errdefs.Errorf(errdefs.ErrConflict, "slurm: job %d holds lease %s of %d unit(s) already; %d asked", sb.job.JobID, held.ID, len(held.Units), req.Units)
	}
	return held.grant(), true, nil
}

// rebindSlurm binds a journaled Slurm lease again if its job still runs.
func rebindSlurm(e journal.Entry) (binding, string) {
	if e.Lease.Slurm == nil || e.SlurmCgroup == "" {
		return nil, "Slurm lease without its job dropped"
	}
	if ended, err := slurmjob.Ended(e.SlurmCgroup); err != nil || ended {
		return nil, "Slurm job ended while the daemon was down"
	}
	if err := slurmjob.CheckMadeBySlurm(e.SlurmCgroup); err != nil {
		return nil, "Slurm job's cgroup is no longer Slurm's"
	}
	return newSlurmBinding(*e.Lease.Slurm, e.SlurmCgroup), ""
}

// ReleaseJob ends every lease of Slurm job id (an epilog's safety net,
// for root and admins) and returns their ids. Like a holder's exit, an end
// happens even when it cannot be recorded.
func (sj *SlurmJobs) ReleaseJob(peer identity.Peer, id uint64) ([]string, error) {
	if !peer.Admin && peer.UID != 0 {
		return nil, errdefs.Errorf(errdefs.ErrPermission, "releasing a Slurm job's leases is for root and the admin group")
	}
	if !sj.t.lockOpen() {
		return nil, errStopping
	}
	defer sj.t.unlock()
	var job []*lease
	sj.t.eachLeaseLocked(func(l *lease) bool {
		if l.Slurm != nil && l.Slurm.JobID == id {
			job = append(job, l)
		}
		return true
	})
	slices.SortFunc(job, func(a, b *lease) int { return strings.Compare(a.ID, b.ID) })
	ended := make([]string, 0, len(job))
	for _, l := range job {
		sj.t.dropAndRecordLocked(l, fmt.Sprintf("Slurm job %d released by its epilog", id), true)
		ended = append(ended, l.ID)
	}
	return ended, nil
}

// addSlurmJob adds job to the ascending list jobs, once.
func addSlurmJob(jobs []uint64, job uint64) []uint64 {
	i, found := slices.BinarySearch(jobs, job)
	if found {
		return jobs
	}
	return slices.Insert(jobs, i, job)
}
