package lease

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"time"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
)

// fullFile stands in for the journal's file on a disk with room bytes left:
// a write puts what fits into the real file and fails with ENOSPC, as write(2)
// on a full tmpfs does. truncErr, when set, makes cutting back fail too.
type fullFile struct {
	*os.File
	room     int
	truncErr error
}

func (f *fullFile) Write(p []byte) (int, error) {
	if len(p) <= f.room {
		f.room -= len(p)
		return f.File.Write(p)
	}
	n, err := f.File.Write(p[:f.room])
	f.room -= n
	if err == nil {
		err = &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
	return n, err
}

func (f *fullFile) Truncate(size int64) error {
	if f.truncErr != nil {
		return f.truncErr
	}
	return f.File.Truncate(size)
}

// fillDisk makes m's journal behave as if the disk had room bytes left; the
// test gives it more room through what it returns.
func fillDisk(m *Manager, room int, truncErr error) *fullFile {
	m.mu.Lock()
	defer m.unlock()
	var full *fullFile
	m.journal.WrapWriter(func(w journal.Writer) journal.Writer {
		full = &fullFile{File: w.(*os.File), room: room, truncErr: truncErr}
		return full
	})
	return full
}

// journalReplay reads f's journal as a restart would.
func (f *fixture) journalReplay(t *testing.T, m *Manager) journal.Replay {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := journal.Decode(b, m.shapes())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestFullDiskRefusesWhatItCannotRecord: an append that fails midway leaves
// no part of a record behind; until the journal is written anew nothing is
// granted (and no FIFO made), released or renewed; an end its holder causes
// still ends the lease; the tick repairs the journal once there is room, and a
// restart then finds exactly the leases the table holds.
func TestFullDiskRefusesWhatItCannotRecord(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	a, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	holder, c := processLease(t, m)
	full := fillDisk(m, 40, nil)

	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1h")); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("grant on a full disk: %v", err)
	}
	if n := f.fifoCount(t, 0); n != 3 {
		t.Fatalf("%d FIFOs after a refused grant, want 3", n)
	}
	if rep := f.journalReplay(t, m); len(rep.Skipped) != 0 || len(rep.Entries) != 3 {
		t.Fatalf("journal after a failed append: %+v", rep)
	}
	if err := m.JournalError(); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("JournalError = %v", err)
	}
	// Room again, but nothing is appended before the journal is rewritten.
	full.room = 1 << 20
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1h")); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("grant before the repair: %v", err)
	}
	if err := m.Release(root, a.ID); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("release on a full disk: %v", err)
	}
	if _, err := m.Get(root, a.ID); err != nil {
		t.Fatalf("lease whose release was refused: %v", err)
	}
	if _, err := m.Renew(root, b.ID); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("renewal on a full disk: %v", err)
	}
	if got, _ := m.Get(root, b.ID); !got.Expires.Equal(*b.Expires) {
		t.Fatalf("refused renewal moved the deadline: %v -> %v", b.Expires, got.Expires)
	}
	// The holder exits: the lease ends although its end is not recorded.
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "lease to end with its holder", func() bool {
		_, err := m.Get(root, c.ID)
		return errors.Is(err, api.ErrNotFound)
	})
	if n := f.fifoCount(t, 0); n != 2 {
		t.Fatalf("%d FIFOs after the holder exited, want 2", n)
	}

	m.Tick()
	if err := m.JournalError(); err != nil {
		t.Fatalf("tick did not repair the journal: %v", err)
	}
	if rep := f.journalReplay(t, m); len(rep.Entries) != 2 {
		t.Fatalf("repaired journal holds %d leases, want 2", len(rep.Entries))
	}
	if err := m.Release(root, a.ID); err != nil {
		t.Fatal(err)
	}
	d, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2 := f.manager(t)
	if got, want := leaseIDs(m2.View()), sortedIDs(b.ID, d.ID); !slices.Equal(got, want) {
		t.Fatalf("after restart %v, want %v", got, want)
	}
}

// TestPartialRecordThatCannotBeCutOff: when even cutting the part of a record
// off fails, the journal stays failed (nothing may be appended behind the
// part), a restart skips the part and keeps every lease, and its rewrite
// leaves the journal whole.
func TestPartialRecordThatCannotBeCutOff(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	var ids []string
	for i := 0; i < 2; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	full := fillDisk(m, 40, syscall.EIO)
	if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1h")); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("grant on a full disk: %v", err)
	}
	if err := m.JournalError(); err == nil || !strings.Contains(err.Error(), "cutting off") {
		t.Fatalf("JournalError = %v, want it to say the part could not be cut off", err)
	}
	full.room = 1 << 20
	if err := m.Release(root, ids[0]); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("release behind a partial record: %v", err)
	}
	if rep := f.journalReplay(t, m); len(rep.Skipped) != 1 || len(rep.Entries) != 2 {
		t.Fatalf("journal with a partial record: %+v", rep)
	}
	m.Close()
	m2 := f.manager(t)
	if got := leaseIDs(m2.View()); !slices.Equal(got, sortedIDs(ids...)) {
		t.Fatalf("after restart %v, want %v", got, ids)
	}
	if rep := f.journalReplay(t, m2); len(rep.Skipped) != 0 || len(rep.Entries) != 2 {
		t.Fatalf("journal after restart: %+v", rep)
	}
}

// TestUnrecordedEndLeavesAClaimersFIFOAlone: a lease ended while its end
// could not be recorded, an offline claimer took its unit, and the daemon
// crashed before the repair. The restart replays the grant and drops the
// lease (its holder is gone), but the FIFO on its unit is the claimer's now.
func TestUnrecordedEndLeavesAClaimersFIFOAlone(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	holder, l := processLease(t, m)
	fillDisk(m, 0, nil)
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "lease to end with its holder", func() bool { return len(m.View().Leases()) == 0 })
	fd := claimOffline(t, f, l.GPU.Index, l.Units[0])
	defer unix.Close(fd)
	m.Close()
	m2 := f.manager(t)
	v := m2.View()
	if len(v.Leases()) != 0 || v.GPUs[l.GPU.Index].Offline != 1 || !f.ledger.Present(l.GPU.Index, l.Units[0]) {
		t.Fatalf("after restart: leases %v, GPU %+v, FIFO present %v", v.Leases(), v.GPUs[l.GPU.Index], f.ledger.Present(l.GPU.Index, l.Units[0]))
	}
}

// TestStartOnAFullDiskKeepsTheJournal: on a full run dir the rewrite at
// start fails; the old journal stays as it was, the leases in it are kept, and
// the Manager starts refusing what it cannot record until a tick can write
// the journal.
func TestStartOnAFullDiskKeepsTheJournal(t *testing.T) {
	f := fixtureOnTmpfs(t, "64k", 1, 4, 1)
	m := f.manager(t)
	l, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	path := filepath.Join(f.dir, "leases.journal")
	before, _ := os.ReadFile(path)
	fill := filepath.Join(f.dir, "fill")
	fillUp(t, fill)
	m2 := f.manager(t)
	if err := m2.JournalError(); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("JournalError on a full run dir = %v", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Fatalf("journal changed by a failed rewrite:\n%s\nwas\n%s", after, before)
	}
	if got := leaseIDs(m2.View()); !slices.Equal(got, []string{l.ID}) {
		t.Fatalf("leases %v, want %s", got, l.ID)
	}
	if _, err := m2.Acquire(context.Background(), root, ttlReq(1, "1h")); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("grant with an unwritable journal: %v", err)
	}
	m2.Tick()
	if m2.JournalError() == nil {
		t.Fatal("journal repaired with the run dir still full")
	}
	os.Remove(fill)
	m2.Tick()
	if err := m2.JournalError(); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Acquire(context.Background(), root, ttlReq(1, "1h")); err != nil {
		t.Fatal(err)
	}
}

// fixtureOnTmpfs is a fixture whose run dir is a tmpfs of size (mount's
// notation) of its own, unmounted when the test ends.
func fixtureOnTmpfs(t *testing.T, size string, m, n, k int) *fixture {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (%v: %s)", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	model, err := units.New(m, n, k, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := fixtureAt(t, dir, model)
	t.Cleanup(func() { f.ledger.Close() })
	return f
}

// fillUp writes path until its file system is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	block := make([]byte, 4096)
	for {
		if _, err := fh.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// A grant whose record fails gives the process back the units it counted:
// once the journal is written again, the same process may take a unit.
func TestFailedGrantGivesBackItsProcessUnits(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	holder, l := processLease(t, m)
	if err := m.Release(root, l.ID); err != nil {
		t.Fatal(err)
	}
	full := fillDisk(m, 40, nil)
	hp := identity.Peer{UID: root.UID, PID: holder.Process.Pid, Admin: true}
	if _, err := m.Acquire(context.Background(), hp, Request{LeaseRequest: api.LeaseRequest{Units: 1}}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("grant on a full journal: %v, want unavailable", err)
	}
	full.room = 1 << 20
	m.Tick()
	if _, err := m.Acquire(context.Background(), hp, Request{LeaseRequest: api.LeaseRequest{Units: 1}}); err != nil {
		t.Fatalf("the process's next grant: %v", err)
	}
}

// A renewal that makes a rewrite due is in the rewritten journal.
func TestRenewalSurvivesTheRewriteItCauses(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	c := clock.NewFake(time.Now())
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	a, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Minute)
	// Renewals to a's old deadline, up to where the next record makes a
	// rewrite due.
	m.mu.Lock()
	for m.journal.Records() < rewriteSlack+2*len(m.leases) {
		if err := m.journal.Append(journal.Record{Op: journal.OpRenew, ID: a.ID, Deadline: a.Expires}); err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Unlock()
	r, err := m.Renew(root, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	rep := f.journalReplay(t, m)
	if len(rep.Entries) != 1 {
		t.Fatalf("entries %+v", rep.Entries)
	}
	if got := *rep.Entries[0].Deadline; !got.Equal(*r.Expires) {
		t.Fatalf("journal deadline %v after the renewal to %v (before it %v)", got, r.Expires, a.Expires)
	}
}
