package lease

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// fakeSlurmTable is a table of leases alone, for the Slurm feature's own
// tests: it records what the feature ends and whether it held the lock.
type fakeSlurmTable struct {
	leases []*lease
	locked bool
	closed bool
	ended  []string
}

func (f *fakeSlurmTable) lockOpen() bool {
	if f.closed {
		return false
	}
	f.locked = true
	return true
}

func (f *fakeSlurmTable) unlock() { f.locked = false }

func (f *fakeSlurmTable) eachLeaseLocked(fn func(*lease) bool) {
	for _, l := range f.leases {
		if !fn(l) {
			return
		}
	}
}

func (f *fakeSlurmTable) dropAndRecordLocked(l *lease, _ string, _ bool) error {
	if !f.locked {
		panic("lease ended without the table's lock")
	}
	f.ended = append(f.ended, l.ID)
	f.leases = slices.DeleteFunc(f.leases, func(x *lease) bool { return x == l })
	return nil
}

func slurmLease(id string, uid uint32, job api.LeaseSlurm, units ...int) *lease {
	return newTableLease(&api.Lease{ID: id, Owner: api.Owner{UID: uid}, Units: units, Slurm: &job}, nil, "")
}

// TestSlurmFeatureAnswersWithTheJobsLease: a request bound to a job that
// holds a lease is answered with that lease when it is the caller's and big
// enough, refused when it is smaller than asked or of the other shape (whole
// GPUs), and left to the table when the job holds none or another user's.
func TestSlurmFeatureAnswersWithTheJobsLease(t *testing.T) {
	job := api.LeaseSlurm{JobID: 7}
	table := &fakeSlurmTable{leases: []*lease{
		slurmLease("l-other-users", 2000, job, 0),
		slurmLease("l-job7", 1000, job, 0, 1, 2),
		slurmLease("l-job8", 1000, api.LeaseSlurm{JobID: 8}, 3),
	}}
	sj := &SlurmJobs{t: table}
	bind := newSlurmBinding(job, "/sys/fs/cgroup/slurm/job_7")
	alice := identity.Peer{UID: 1000}
	req := func(units, gpus int) Request {
		return Request{LeaseRequest: api.LeaseRequest{Units: units, GPUs: gpus}}
	}

	g, found, err := sj.answerLocked(alice, req(2, 0), bind)
	if err != nil || !found || g.ID != "l-job7" {
		t.Fatalf("2 units: %v, found %v, err %v; want the job's lease l-job7", g.ID, found, err)
	}
	if _, found, err = sj.answerLocked(alice, req(4, 0), bind); !found || !errors.Is(err, api.ErrConflict) {
		t.Fatalf("4 units of a 3-unit lease: found %v, err %v; want a conflict", found, err)
	}
	if _, found, err = sj.answerLocked(alice, req(0, 1), bind); !found || !errors.Is(err, api.ErrConflict) {
		t.Fatalf("a whole GPU of a units lease: found %v, err %v; want a conflict", found, err)
	}
	if _, found, _ = sj.answerLocked(identity.Peer{UID: 3000}, req(1, 0), bind); found {
		t.Fatal("another user's request was answered with the job's lease")
	}
	if _, found, _ = sj.answerLocked(alice, req(1, 0), newTTLBinding(0, time.Time{})); found {
		t.Fatal("a request bound to no Slurm job was answered")
	}
}

// TestSlurmFeatureReleasesEveryLeaseOfTheJob: the epilog's release ends
// every lease of the job, whoever's, in id order, under the lock, and no
// other; it is root's and the admins' alone.
func TestSlurmFeatureReleasesEveryLeaseOfTheJob(t *testing.T) {
	job := api.LeaseSlurm{JobID: 7}
	table := &fakeSlurmTable{leases: []*lease{
		slurmLease("l-b", 1000, job, 0),
		slurmLease("l-c", 1000, api.LeaseSlurm{JobID: 8}, 1),
		slurmLease("l-a", 2000, api.LeaseSlurm{JobID: 7, Step: "0"}, 2),
	}}
	sj := &SlurmJobs{t: table}
	if _, err := sj.ReleaseJob(identity.Peer{UID: 1000}, 7); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("a user's release: %v, want forbidden", err)
	}
	ended, err := sj.ReleaseJob(identity.Peer{Admin: true, UID: 50}, 7)
	if err != nil || !slices.Equal(ended, []string{"l-a", "l-b"}) || !slices.Equal(table.ended, ended) {
		t.Fatalf("released %v (table ended %v), err %v; want l-a, l-b", ended, table.ended, err)
	}
	if table.locked {
		t.Fatal("the lock was kept")
	}
	if ended, err = sj.ReleaseJob(identity.Peer{UID: 0}, 9); err != nil || ended == nil || len(ended) != 0 {
		t.Fatalf("a job with no lease: %v, %v; want an empty list", ended, err)
	}
	table.closed = true
	if _, err = sj.ReleaseJob(identity.Peer{UID: 0}, 8); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a closed table: %v, want unavailable", err)
	}
}
