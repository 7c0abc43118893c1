package lease

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

// claimOffline claims unit i of GPU g the way docs/design.md §5 says, returning
// the descriptor that holds the claim.
func claimOffline(t *testing.T, f *fixture, g, i int) int {
	t.Helper()
	dir := filepath.Dir(f.ledger.Path(g, i))
	tmp := filepath.Join(dir, ".claim-test")
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := unix.Link(tmp, f.ledger.Path(g, i)); err != nil {
		t.Fatal(err)
	}
	unix.Unlink(tmp)
	return fd
}

func TestOfflineClaimsAreCountedAndNeverLeased(t *testing.T) {
	f := newFixture(t, 1, 2, 1) // 2 units per GPU
	m := f.manager(t)
	fd := claimOffline(t, f, 0, 0)
	testutil.Eventually(t, "offline claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	unix.Mkfifo(f.ledger.Path(0, 1), 0o600) // a claim nobody holds: stale
	testutil.Eventually(t, "second claim counted", func() bool { return m.View().GPUs[0].Offline == 2 })
	l, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: time.Minute})
	if !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("leased a claimed unit: %+v %v", l, err)
	}
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 1 || f.ledger.Present(0, 1) {
		t.Fatalf("stale claim not removed: %+v", v.GPUs[0])
	}
	unix.Close(fd)
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Used != 0 {
		t.Fatalf("released claim still counted: %+v", v.GPUs[0])
	}
}

// TestReplacedOfflineClaimIsProbedByItsOwnFIFO: a claim whose FIFO is replaced
// by another claimer's (their remove and create seen as one) must be probed,
// and freed, by the FIFO that is there now.
func TestReplacedOfflineClaimIsProbedByItsOwnFIFO(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	fdA := claimOffline(t, f, 0, 2)
	testutil.Eventually(t, "claim A counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	// A goes and B takes the same unit before the daemon looks.
	unix.Unlink(f.ledger.Path(0, 2))
	unix.Close(fdA)
	fdB := claimOffline(t, f, 0, 2)
	(*ledgerEvents)(m).Units([]ledger.UnitEvent{{GPU: 0, Unit: 2}})
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 1 {
		t.Fatalf("B's live claim lost: %+v", v.GPUs[0])
	}
	unix.Close(fdB)
	m.probeOffline()
	if v := m.View(); v.GPUs[0].Offline != 0 || f.ledger.Present(0, 2) {
		t.Fatalf("B's stale claim never removed: %+v", v.GPUs[0])
	}
}

// TestClaimRightBehindLeaseChurnIsCounted: the watch skips the events of the
// daemon's own FIFOs by count; a claim whose events arrive among them, on the
// very unit the churn keeps using, must still be counted, never leased, and
// freed when dropped, and once every event is in, no skip may remain pending.
func TestClaimRightBehindLeaseChurnIsCounted(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	pending := func() (n uint32) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, g := range m.gpus {
			for _, s := range g.slots {
				n += s.own
			}
		}
		return n
	}
	for round := 0; round < 20; round++ {
		for i := 0; i < 50; i++ {
			l, err := m.Acquire(context.Background(), root, ttlReq(1, "1m"))
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Release(root, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		// Best fit keeps taking unit 0 of GPU 0: claim it while the churn's
		// events may still be on their way.
		fd := claimOffline(t, f, 0, 0)
		testutil.Eventually(t, "claim behind churn counted", func() bool { return m.View().GPUs[0].Offline == 1 })
		l, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: time.Minute})
		if err != nil || l.Units[0] == 0 {
			t.Fatalf("round %d: lease %+v, %v: the claimed unit was leased", round, l, err)
		}
		m.Release(root, l.ID)
		unix.Close(fd)
		m.probeOffline()
		testutil.Eventually(t, "dropped claim freed", func() bool { return m.View().GPUs[0].Used == 0 })
		testutil.Eventually(t, "every own event arrived", func() bool { return pending() == 0 })
	}
}
