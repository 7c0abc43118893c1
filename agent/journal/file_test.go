package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A daemon that dies in a rewrite leaves the new journal's temporary file
// beside the journal. Nothing else would ever remove it, and in a run dir of
// a few megabytes it holds room the journal needs: the next daemon's first
// rewrite removes it, and nothing else.
func TestFirstRewriteRemovesWhatACrashedRewriteLeft(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "leases.journal")
	left := filepath.Join(dir, ".leases.journal.2718281828")
	keep := []string{
		filepath.Join(dir, ".leases.journal.x1"),
		filepath.Join(dir, ".layout.json.31415"),
		filepath.Join(dir, "leases.journal.1"),
	}
	for _, p := range append([]string{left}, keep...) {
		if err := os.WriteFile(p, []byte("part of a journal"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	j := NewFile(path)
	defer j.Close()
	if err := j.Rewrite(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Fatalf("temporary file of a crashed rewrite still there: %v", err)
	}
	for _, p := range keep {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
}

// disk is a journal file on a file system of a set capacity: what it holds
// past capacity fails with ENOSPC, except where room was kept (Reserve).
type disk struct {
	*os.File
	size, kept, capacity int64
}

func (d *disk) Write(b []byte) (int, error) {
	if end := d.size + int64(len(b)); end > max(d.kept, d.capacity) {
		return 0, unix.ENOSPC
	}
	n, err := d.File.Write(b)
	d.size += int64(n)
	return n, err
}

func (d *disk) Reserve(off, n int64) error {
	if off+n > max(d.kept, d.capacity) {
		return unix.ENOSPC
	}
	d.kept = max(d.kept, off+n)
	return nil
}

// fill takes every byte not yet written or kept, as a user's file would.
func (d *disk) fill() { d.capacity = max(d.size, d.kept) }

// TestReleasesRecordedOnAFullDisk: once the disk fills, a grant or a
// renewal is refused (and the file says why), but every lease the file
// holds can still be ended, and a replay finds them ended; once there is
// room, a rewrite takes grants again.
func TestReleasesRecordedOnAFullDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.journal")
	j := NewFile(path)
	defer j.Close()
	leases := replayLeases()
	if err := j.Rewrite(leases[:1]); err != nil {
		t.Fatal(err)
	}
	var d *disk
	j.WrapWriter(func(w Writer) Writer {
		st, err := w.(*os.File).Stat()
		if err != nil {
			t.Fatal(err)
		}
		d = &disk{File: w.(*os.File), size: st.Size(), capacity: 1 << 30}
		return d
	})
	// The room kept for this file so far is the file's own: a user's
	// file takes the rest.
	d.kept = j.kept
	if err := j.Append(Record{Op: OpLease, Entry: &leases[1]}); err != nil {
		t.Fatal(err)
	}
	d.fill()
	// Grants go on while the room kept ahead holds them and the ends of
	// all, then are refused.
	ids := []string{leases[0].Lease.ID, leases[1].Lease.ID}
	extra := leases[0]
	for {
		extra.Lease.ID = fmt.Sprintf("l-%016x", 0xcc00+len(ids))
		err := j.Append(Record{Op: OpLease, Entry: &extra})
		if errors.Is(err, unix.ENOSPC) {
			break
		}
		if err != nil || len(ids) > 10000 {
			t.Fatalf("grant %d on a full disk: %v", len(ids), err)
		}
		ids = append(ids, extra.Lease.ID)
	}
	deadline := time.Now()
	if err := j.Append(Record{Op: OpRenew, ID: leases[1].Lease.ID, Deadline: &deadline}); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("renewal on a full disk: %v, want ENOSPC", err)
	}
	if j.Failed() == nil {
		t.Fatal("a journal that cannot take grants says nothing")
	}
	for _, id := range ids {
		if err := j.Append(Record{Op: OpEnd, ID: id, PeakMemoryMiB: 1 << 40}); err != nil {
			t.Fatalf("release of %s on a full disk: %v", id, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Decode(b, replayShapes())
	if err != nil || len(rep.Entries) != 0 || len(rep.Skipped) != 0 {
		t.Fatalf("replay after the releases: %+v, %v; want no lease and nothing skipped", rep, err)
	}
	// Room again: a rewrite takes grants again.
	if err := j.Rewrite(nil); err != nil || j.Failed() != nil {
		t.Fatalf("rewrite with room: %v, failed %v", err, j.Failed())
	}
	if err := j.Append(Record{Op: OpLease, Entry: &extra}); err != nil {
		t.Fatal(err)
	}
}
