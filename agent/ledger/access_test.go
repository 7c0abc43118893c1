package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// folderState is an instance folder's group, mode and access ACL (nil:
// none).
func folderState(t *testing.T, dir string) (gid uint32, mode uint32, acl []byte) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	n, err := unix.Getxattr(dir, aclXattr, buf)
	switch {
	case errors.Is(err, unix.ENODATA):
	case err != nil:
		t.Fatalf("%s: %v", dir, err)
	default:
		acl = buf[:n]
	}
	return st.Gid, st.Mode & 0o7777, acl
}

// TestSetAccess: a GPU restricted to one group is that group's; to users
// and several groups, root's with an ACL naming each; to nobody, root's
// alone; open again, the socket group's without an ACL. Every instance
// folder of the GPU, and only its, changes.
func TestSetAccess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give folders to other groups; runs as", os.Geteuid())
	}
	l := newTestLedger(t)
	want := func(g int, gid, mode uint32, acl []byte) {
		t.Helper()
		for k := 0; k < 2; k++ {
			dir := l.InstanceDir(g, k)
			if gotGID, gotMode, gotACL := folderState(t, dir); gotGID != gid || gotMode != mode || !bytes.Equal(gotACL, acl) {
				t.Fatalf("%s: group %d mode %#o ACL %x; want %d %#o %x", dir, gotGID, gotMode, gotACL, gid, mode, acl)
			}
		}
	}
	if err := l.SetAccess(0, Access{Restricted: true, GIDs: []uint32{5000, 5000}}); err != nil {
		t.Fatal(err)
	}
	want(0, 5000, 0o1770, nil)
	want(1, uint32(testGID()), 0o1770, nil)

	if err := l.SetAccess(0, Access{Restricted: true, UIDs: []uint32{7001, 7000}, GIDs: []uint32{5001, 5000}}); err != nil {
		if errors.Is(err, ErrNoACL) {
			t.Skip("the test's file system keeps no POSIX ACLs:", err)
		}
		t.Fatal(err)
	}
	acl := accessACL([]uint32{7000, 7001}, []uint32{5000, 5001})
	want(0, 0, 0o1770, acl)
	// The entries the kernel reads: owner, users by id, owning group (no
	// rights), groups by id, mask, others (no rights).
	type entry struct {
		Tag, Perm uint16
		ID        uint32
	}
	entries := make([]entry, (len(acl)-4)/8)
	if err := binary.Read(bytes.NewReader(acl[4:]), binary.LittleEndian, entries); err != nil {
		t.Fatal(err)
	}
	wantEntries := []entry{{aclUserObj, 7, aclUndefinedID}, {aclUser, 7, 7000}, {aclUser, 7, 7001}, {aclGroupObj, 0, aclUndefinedID},
		{aclGroup, 7, 5000}, {aclGroup, 7, 5001}, {aclMask, 7, aclUndefinedID}, {aclOther, 0, aclUndefinedID}}
	if binary.LittleEndian.Uint32(acl) != aclVersion || len(entries) != len(wantEntries) {
		t.Fatalf("ACL %x", acl)
	}
	for i := range entries {
		if entries[i] != wantEntries[i] {
			t.Fatalf("entry %d: %+v, want %+v", i, entries[i], wantEntries[i])
		}
	}

	if err := l.SetAccess(0, Access{Restricted: true}); err != nil {
		t.Fatal(err)
	}
	want(0, 0, 0o1700, nil)
	if err := l.SetAccess(0, Access{}); err != nil {
		t.Fatal(err)
	}
	want(0, uint32(testGID()), 0o1770, nil)
}
