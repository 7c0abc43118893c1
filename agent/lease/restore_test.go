package lease

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/pipefile"
)

func TestRestartKeepsLiveLeasesAndFreesDeadOnes(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	live := exec.Command("sleep", "60")
	dead := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{live, dead} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	l1, err := m1.Acquire(context.Background(), identity.Peer{UID: root.UID, PID: live.Process.Pid, Admin: true}, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m1.Acquire(context.Background(), identity.Peer{UID: root.UID, PID: dead.Process.Pid, Admin: true}, Request{LeaseRequest: api.LeaseRequest{Units: 1}})
	if err != nil {
		t.Fatal(err)
	}
	l3, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon "crashes": it stops watching without ending anything.
	m1.Close()
	dead.Process.Kill()
	dead.Wait()
	// A FIFO nobody holds and no lease owns appears meanwhile.
	unix.Mkfifo(f.ledger.Path(1, 3), 0o600)

	m2 := f.manager(t)
	v := m2.View()
	ids := []string{}
	for _, l := range v.Leases() {
		ids = append(ids, l.ID)
	}
	if !slices.Contains(ids, l1.ID) || !slices.Contains(ids, l3.ID) || slices.Contains(ids, l2.ID) {
		t.Fatalf("after restart leases %v; want %s and %s kept, %s freed", ids, l1.ID, l3.ID, l2.ID)
	}
	got, _ := m2.Get(root, l3.ID)
	if !got.Expires.Equal(*l3.Expires) {
		t.Fatalf("ttl lease deadline changed: %v -> %v", l3.Expires, got.Expires)
	}
	total := 0
	for g := range f.devs {
		if f.fifoCount(t, g) != v.GPUs[g].Used {
			t.Fatalf("GPU %d: %d FIFOs, %d used", g, f.fifoCount(t, g), v.GPUs[g].Used)
		}
		total += v.GPUs[g].Used
	}
	if total != 2 {
		t.Fatalf("%d units used after restart, want 2", total)
	}
	live.Process.Kill()
	live.Wait()
	testutil.Eventually(t, "kept lease to end with its process", func() bool { return len(m2.View().Leases()) == 1 })
}

func TestCorruptJournalIsRebuiltFromLedger(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	os.WriteFile(filepath.Join(f.dir, "leases.journal"), []byte("{not json"), 0o600)
	unix.Mkfifo(f.ledger.Path(0, 2), 0o600)
	m := f.manager(t)
	if v := m.View(); len(v.Leases()) != 0 || v.GPUs[0].Used != 0 || f.ledger.Present(0, 2) {
		t.Fatalf("after corrupt journal: %+v", v)
	}
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if !strings.Contains(string(b), journal.Schema) {
		t.Fatalf("journal not rewritten: %s", b)
	}
}

func TestJournalStaysShortAndReplays(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	keep, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	// Three records a round: enough rounds to pass the rewrite's slack twice.
	rounds := 2 * rewriteSlack / 3
	for i := 0; i < rounds; i++ {
		l, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m1.Renew(root, l.ID); err != nil {
			t.Fatal(err)
		}
		if err := m1.Release(root, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines > rewriteSlack+10 {
		t.Fatalf("journal has %d records after %d changes: not rewritten", lines, 3*rounds)
	}
	m1.Close()
	m2 := f.manager(t)
	if v := m2.View(); len(v.Leases()) != 1 || v.Leases()[0].ID != keep.ID {
		t.Fatalf("after replay: %+v", v.Leases())
	}
}

// TestRestoreDropsALeaseWhoseUnitWasClaimedOffline: while the daemon was down,
// a kept lease's FIFO was removed and an offline claimer took the unit.
func TestRestoreDropsALeaseWhoseUnitWasClaimedOffline(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m1 := f.manager(t)
	l, err := m1.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()
	unix.Unlink(f.ledger.Path(l.GPU.Index, l.Units[0]))
	fd := claimOffline(t, f, l.GPU.Index, l.Units[0])
	defer unix.Close(fd)
	m2 := f.manager(t)
	v := m2.View()
	if len(v.Leases()) != 0 || v.GPUs[l.GPU.Index].Offline != 1 || v.GPUs[l.GPU.Index].Used != 1 {
		t.Fatalf("after restore: leases %d, GPU %+v", len(v.Leases()), v.GPUs[l.GPU.Index])
	}
}

// TestClosedManagerLeavesLeasesToTheNextStart: once the daemon stops, nothing
// it still hears (a holder's exit, a release) may end a lease: the lease stays
// in the journal and the ledger for the next start to judge.
func TestClosedManagerLeavesLeasesToTheNextStart(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	cmd, l := processLease(t, m)
	kept, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	cmd.Process.Kill()
	cmd.Wait()
	// Close took the pidfd, so the exit reaches no one; and what was already
	// on its way (an exit seen, a timer fired, a release) ends nothing.
	m.end(l.ID, "process exited")
	m.mu.Lock()
	timer := m.expiries.gen
	m.mu.Unlock()
	m.expiries.expireDue(timer)
	if err := m.Release(root, kept.ID); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("release after Close: %v", err)
	}
	if f.fifoCount(t, 0) != 2 {
		t.Fatalf("%d FIFOs after Close, want both leases' 2", f.fifoCount(t, 0))
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := journal.Decode(b, m.shapes())
	if err != nil || len(rep.Entries) != 2 {
		t.Fatalf("journal after Close holds %d leases (%v), want 2", len(rep.Entries), err)
	}
	// The next start judges them: the holder is dead, the ttl lease lives.
	m2 := f.manager(t)
	if v := m2.View(); len(v.Leases()) != 1 || v.Leases()[0].ID != kept.ID {
		t.Fatalf("after restart: %+v, want only %s (and not %s)", v.Leases(), kept.ID, l.ID)
	}
}

// When both units of a kept lease were claimed offline while the daemon was
// down, the restart drops the lease and leaves both claimers' FIFOs alone: it
// removes only what it made itself.
func TestRestoreLeavesEveryClaimersFIFO(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t)
	l, err := m.Acquire(context.Background(), root, ttlReq(2, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	dir, err := pipefile.OpenFolder(f.ledger.InstanceDir(l.GPU.Index, l.Instance))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range l.Units {
		f.ledger.Remove(l.GPU.Index, u)
		if _, ok, err := dir.Claim(u); !ok || err != nil {
			t.Fatalf("claim of unit %d: %v %v", u, ok, err)
		}
	}
	m2 := f.manager(t)
	for _, u := range l.Units {
		if !f.ledger.Present(l.GPU.Index, u) {
			t.Errorf("the claimer's FIFO of unit %d was removed by the restart", u)
		}
	}
	if v := m2.View(); len(v.Leases()) != 0 || v.GPUs[l.GPU.Index].Offline != 2 {
		t.Fatalf("after restart: %d leases, %d offline units; want 0 and 2", len(v.Leases()), v.GPUs[l.GPU.Index].Offline)
	}
}
