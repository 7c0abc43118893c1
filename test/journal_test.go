package test

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestFullRunDirNeitherLosesNorRevivesLeases: the run dir (a small tmpfs, as
// /run is) fills up with what is not gpuletd's to remove. While it is full
// the daemon must refuse what it cannot record (grants and renewals, with
// 503) but still record releases, say so in the snapshot, leave the journal
// whole, and start again after a kill -9; once space returns it must recover
// by itself, and a restart then brings back exactly the leases it
// acknowledged and none it released.
func TestFullRunDirNeitherLosesNorRevivesLeases(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a tmpfs; runs as", os.Getuid())
	}
	mnt := tmpfsRunDir(t, "64k")
	d := e2e.Start(t, "--run-dir", mnt, "--socket-group", "nogroup")
	d.RunDir = mnt
	ctx := e2e.Ctx(t)
	ttl := api.LeaseRequest{Units: 1, TTL: "10m"}
	var ids []string
	for i := 0; i < 5; i++ {
		l, err := d.Client.Lease(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	// Outside the ledger's folders: the sweep leaves it.
	fill := filepath.Join(mnt, "fill")
	fillAs(t, fill, 0)

	// Full. The room the journal kept ahead (4 KiB) may still take some
	// grants, and those leases are acknowledged; then a grant is refused,
	// and leaves no FIFO behind.
	for {
		l, err := d.Client.Lease(ctx, ttl)
		if err == nil {
			ids = append(ids, l.ID)
			if len(ids) > 100 {
				t.Fatal("still granting with the run dir full")
			}
			continue
		}
		if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("lease on a full run dir: %v; want unavailable saying why", err)
		}
		break
	}
	checkJournalWhole(t, mnt)
	checkFIFOsMatch(t, d, len(ids))
	testutil.Eventually(t, "snapshot to say the node is degraded and why", func() bool {
		s, err := d.Client.Snapshot(ctx)
		return err == nil && s.State == api.NodeDegraded && strings.Contains(s.Reason, "no space left")
	})
	// A release is recorded in the room the journal kept for it.
	if err := d.Client.Release(ctx, ids[0]); err != nil {
		t.Fatalf("release on a full run dir: %v", err)
	}
	ids = ids[1:]
	if _, err := d.Client.Renew(ctx, ids[0]); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("renewal on a full run dir: %v; want unavailable", err)
	}
	checkJournalWhole(t, mnt)
	checkFIFOsMatch(t, d, len(ids))

	// A crash while full: the daemon starts on what is already there.
	d.Kill9()
	d.Restart()
	checkLeases(t, d, ids)
	checkFIFOsMatch(t, d, len(ids))
	testutil.Eventually(t, "restarted daemon to say it is degraded", func() bool {
		s, err := d.Client.Snapshot(ctx)
		return err == nil && s.State == api.NodeDegraded
	})
	if _, err := d.Client.Lease(ctx, ttl); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("lease after a restart on a full run dir: %v; want unavailable", err)
	}

	// Space returns: the daemon recovers without help.
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "snapshot to say the node works again", func() bool {
		s, err := d.Client.Snapshot(ctx)
		return err == nil && s.State == api.NodeWorking && s.Reason == ""
	})
	if err := d.Client.Release(ctx, ids[0]); err != nil {
		t.Fatalf("release once space returned: %v", err)
	}
	want := slices.Clone(ids[1:])
	for i := 0; i < 3; i++ {
		l, err := d.Client.Lease(ctx, ttl)
		if err != nil {
			t.Fatalf("lease once space returned: %v", err)
		}
		want = append(want, l.ID)
	}
	checkJournalWhole(t, mnt)
	d.Kill9()
	d.Restart()
	checkLeases(t, d, want)
	checkFIFOsMatch(t, d, len(want))
	if log := d.Log.String(); strings.Contains(log, "skipped") || strings.Contains(log, "dropped") {
		t.Fatalf("restart found damage in the journal:\n%s", log)
	}
}

// TestDotFileFillingRunDirIsSwept: a member of the socket group fills the
// run dir through a dot-file in an instance folder, a name that is no unit
// name. gpuletd made no such file: it is removed within a sample interval,
// the log names it and its owner's uid, and leasing goes on.
func TestDotFileFillingRunDirIsSwept(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a tmpfs and to fill it as another user; runs as", os.Getuid())
	}
	mnt := tmpfsRunDir(t, "64k")
	d := e2e.Start(t, "--run-dir", mnt, "--socket-group", "nogroup")
	d.RunDir = mnt
	ctx := e2e.Ctx(t)
	s, err := d.Client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fill := filepath.Join(mnt, "units", s.GPUs[0].UUID, "0", ".fill")
	fillAs(t, fill, 65534)
	testutil.Eventually(t, "the dot-file removed and named in the log with its owner", func() bool {
		_, err := os.Lstat(fill)
		return os.IsNotExist(err) && strings.Contains(d.Log.String(), "path="+fill+" type=file uid=65534")
	})
	testutil.Eventually(t, "leasing to work again", func() bool {
		_, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "10m"})
		return err == nil
	})
}

// tmpfsRunDir mounts a tmpfs of size (mount's notation) for a run dir,
// unmounted when the test ends, and lets other users reach it.
func tmpfsRunDir(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	mnt := filepath.Join(dir, "run")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs for the run dir (%v: %s)", err, bytes.TrimSpace(out))
	}
	// Registered after t.TempDir's removal, so it runs before it; and before
	// e2e.Start's stop, so it runs after the daemon is gone.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	// t.TempDir folders are private to root; let the filler reach the mount.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	return mnt
}

// fillAs writes zeros to path as uid until the filesystem is full.
func fillAs(t *testing.T, path string, uid uint32) {
	t.Helper()
	cmd := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=4096")
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	out, _ := cmd.CombinedOutput() // dd fails when the disk is full: that is the point
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	if st.Bavail != 0 {
		t.Fatalf("filesystem not full after dd (%d blocks left): %s", st.Bavail, out)
	}
}

// checkJournalWhole checks that every line of the journal is a whole,
// checksummed record: a failed append must leave no part of one behind.
func checkJournalWhole(t *testing.T, runDir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("journal ends in a partial record: %q", b[max(0, len(b)-80):])
	}
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var sum uint32
		if len(line) < 10 || line[8] != ' ' {
			t.Fatalf("journal line %d malformed: %q", i+1, line)
		}
		if _, err := fmt.Sscanf(line[:8], "%08x", &sum); err != nil || crc32.ChecksumIEEE([]byte(line[9:])) != sum {
			t.Fatalf("journal line %d damaged: %q", i+1, line)
		}
	}
}

// checkLeases checks that the daemon holds exactly the leases want.
func checkLeases(t *testing.T, d *e2e.Daemon, want []string) {
	t.Helper()
	ls, err := d.Client.Leases(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range ls {
		got = append(got, l.ID)
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("leases after restart:\n%v\nwant\n%v\nlog:\n%s", got, want, d.Log.String())
	}
}

// checkFIFOsMatch checks that the ledger holds a FIFO per used unit, used
// units in all.
func checkFIFOsMatch(t *testing.T, d *e2e.Daemon, used int) {
	t.Helper()
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range s.GPUs {
		if f := e2e.CountFIFOs(t, d.RunDir, g.UUID); f != g.UnitsUsed {
			t.Fatalf("GPU %d: %d FIFOs, %d units used", g.Index, f, g.UnitsUsed)
		}
		n += g.UnitsUsed
	}
	if n != used {
		t.Fatalf("%d units used, want %d", n, used)
	}
}
