package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Access is who may claim units of one GPU offline: create FIFOs in its
// instance folders. The zero Access is the ledger's audience, as New set it
// (the socket group, or every user without one).
type Access struct {
	// Restricted is true when only UIDs, the members of GIDs and root may
	// claim (a GPU only in pools that name their users).
	Restricted bool
	UIDs       []uint32
	GIDs       []uint32
}

// ErrNoACL says that the run dir's file system keeps no POSIX ACLs, so a
// GPU whose claimers are not exactly one group was closed to all but root.
var ErrNoACL = errors.New("the run dir's file system keeps no POSIX ACLs")

// SetAccess makes GPU g's instance folders writable by a's claimers only.
// Restricted to exactly one group and no single user, the folders belong to
// that group (mode 1770): it works on any file system. Otherwise they
// belong to the daemon's group (root's as root), mode 1770, with a POSIX access ACL that lets each
// of a's users and groups in; on a file system without ACLs they stay
// closed to all but root (fail closed) and the error wraps ErrNoACL. The
// sticky bit stays: a claimer removes only its own FIFOs. Claims already
// made are left alone.
func (l *Ledger) SetAccess(g int, a Access) error {
	for k := 0; k < l.model.InstancesPerGPU; k++ {
		if err := setAccess(l.InstanceDir(g, k), a, l.gid); err != nil {
			return err
		}
	}
	return nil
}

func setAccess(dir string, a Access, socketGID int) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ledger: %s: %w", dir, err)
	}
	defer unix.Close(fd)
	a.UIDs, a.GIDs = slices.Clone(a.UIDs), slices.Clone(a.GIDs)
	slices.Sort(a.UIDs)
	slices.Sort(a.GIDs)
	a.UIDs, a.GIDs = slices.Compact(a.UIDs), slices.Compact(a.GIDs)
	// Where no group is let in, the folder is the daemon's own group's
	// (root's as root): a daemon of a plain user may give it no other, and
	// mode and ACL give that group nothing beyond what everyone has.
	own := unix.Getegid()
	gid, mode, acl := socketGID, uint32(0o1770), []byte(nil)
	switch {
	case !a.Restricted && socketGID < 0:
		gid, mode = own, 0o1777
	case !a.Restricted:
	case len(a.UIDs) == 0 && len(a.GIDs) == 1:
		gid = int(a.GIDs[0])
	case len(a.UIDs)+len(a.GIDs) == 0:
		gid, mode = own, 0o1700
	default:
		gid, acl = own, accessACL(a.UIDs, a.GIDs)
	}
	if err := unix.Fchown(fd, -1, gid); err != nil {
		return fmt.Errorf("ledger: giving %s to group %d: %w", dir, gid, err)
	}
	// The ACL goes first: a folder is never open wider than asked, even
	// for a moment (its old ACL is dropped before the mode opens it).
	if err := unix.Fremovexattr(fd, aclXattr); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("ledger: %s: removing its ACL: %w", dir, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("ledger: %s: %w", dir, err)
	}
	if acl == nil {
		return nil
	}
	if err := unix.Fsetxattr(fd, aclXattr, acl, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			unix.Fchmod(fd, 0o1700)
			return fmt.Errorf("ledger: %s: %w: only root may claim there", dir, ErrNoACL)
		}
		return fmt.Errorf("ledger: %s: setting its ACL: %w", dir, err)
	}
	return nil
}

// The POSIX ACL as the kernel takes it in the system.posix_acl_access
// extended attribute (linux/posix_acl_xattr.h): a version, then entries of
// tag, permissions and id, little-endian, ordered by tag, then id.
const (
	aclXattr       = "system.posix_acl_access"
	aclVersion     = 2
	aclUserObj     = 0x01
	aclUser        = 0x02
	aclGroupObj    = 0x04
	aclGroup       = 0x08
	aclMask        = 0x10
	aclOther       = 0x20
	aclUndefinedID = 0xffffffff
	aclRWX         = 7
)

// accessACL lets the owner (root), uids and the groups gids read, write and
// search the folder, and nobody else.
// uids and gids are sorted, each once.
func accessACL(uids, gids []uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	entry := func(tag uint16, perm uint16, id uint32) {
		b = binary.LittleEndian.AppendUint16(b, tag)
		b = binary.LittleEndian.AppendUint16(b, perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	entry(aclUserObj, aclRWX, aclUndefinedID)
	for _, u := range uids {
		entry(aclUser, aclRWX, u)
	}
	// The owning group is the daemon's: no one is let in through it.
	entry(aclGroupObj, 0, aclUndefinedID)
	for _, g := range gids {
		entry(aclGroup, aclRWX, g)
	}
	entry(aclMask, aclRWX, aclUndefinedID)
	entry(aclOther, 0, aclUndefinedID)
	return b
}
