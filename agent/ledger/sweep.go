package ledger

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/pipefile"
)

// Removed is an entry that Sweep removed: one at a unit name that is not a
// FIFO, so no claim, or one at another name (strays.go).
type Removed struct {
	GPU, Instance int
	// Unit is the unit whose name the entry had; -1 for another name.
	Unit int
	Path string
	// Type is what it was: "file", "folder", "symlink", "socket", ...
	Type string
	// UID owns the entry itself (never what a symlink points to).
	UID uint32
}

// defaultSweepBudget bounds the entries one Sweep deletes inside folders
// planted at unit names; a bigger tree is finished by the next Sweeps.
const defaultSweepBudget = 4096

// maxOpenDepth bounds the folders open at once while one is removed: deeper
// ones are moved up into the folder being removed and cleared by a later pass.
const maxOpenDepth = 16

// errBudget stops a removal that has used up this Sweep's budget.
var errBudget = errors.New("sweep budget used up")

// Sweep removes every entry at a unit name that is not a FIFO (a file, a
// folder, a symlink, a socket), never following it: they are no claim, but
// would keep the daemon from making the unit's FIFO. Each removal is logged
// once, with its owner's uid, within a budget of lines a second. Sweep also
// logs what the watch noted since the last call. The daemon calls it every
// sample interval. Then it reads on through each folder's other names, a
// bounded number each time, and removes what gpuletd did not make there
// (strays.go): its cost does not grow with what else is in the folders.
func (l *Ledger) Sweep() []Removed {
	var out []Removed
	budget := l.sweepBudget
	for _, g := range l.gpus {
		for k, dir := range l.dirs[g.Index] {
			for _, i := range l.model.InstanceUnits(k) {
				name := pipefile.UnitName(i)
				st, err := l.lstatDetaching(dir.FD(), name, l.Path(g.Index, i))
				if err != nil || pipefile.IsFIFO(&st) {
					continue
				}
				if err := l.removeEntry(dir.FD(), name, &st, &budget); err != nil {
					if !errors.Is(err, errBudget) {
						l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: cannot remove an entry at a unit name that is not a FIFO", "path", l.Path(g.Index, i), "uid", st.Uid, "err", err)
					}
					continue
				}
				r := Removed{GPU: g.Index, Instance: k, Unit: i, Path: l.Path(g.Index, i), Type: typeName(st.Mode), UID: st.Uid}
				out = append(out, r)
				l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: removed an entry at a unit name that is not a FIFO, so no claim", "path", r.Path, "type", r.Type, "uid", r.UID)
			}
		}
	}
	out = append(out, l.sweepStrays(&budget)...)
	l.logWatchNotes()
	l.sweptLog.Flush()
	l.watchLog.Flush()
	return out
}

// removeEntry removes the entry name of folder dirfd that st describes,
// following nothing. Only the entry's owner could swap another in meanwhile
// (the folders are sticky): a folder is removed with rmdir, which takes no
// other kind, and anything else with unlink, which takes no folder.
func (l *Ledger) removeEntry(dirfd int, name string, st *unix.Stat_t, budget *int) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err := unix.Unlinkat(dirfd, name, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	top, err := openDirAt(dirfd, name)
	if err != nil {
		return err
	}
	defer top.Close()
	for {
		if err := l.clearDir(top, top, 1, budget); err != nil {
			return err
		}
		err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		// Something came in meanwhile, or a folder was moved up: list again
		// from the start. Every pass costs budget, even one that found
		// nothing to delete.
		*budget--
		if *budget <= 0 {
			return errBudget
		}
		if _, err := top.f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
}

// dirFile is a folder open for listing, with its descriptor for the *at calls.
type dirFile struct {
	fd int
	f  *os.File
}

func openDirAt(dirfd int, name string) (*dirFile, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &dirFile{fd: fd, f: os.NewFile(uintptr(fd), name)}, nil
}

func (d *dirFile) Close() error { return d.f.Close() }

// clearDir deletes what dir holds, at depth below the folder top being
// removed. A sub-folder that would be opened deeper than maxOpenDepth is moved
// into top instead, for the next pass: descriptors stay bounded however deep
// the tree.
func (l *Ledger) clearDir(top, dir *dirFile, depth int, budget *int) error {
	for {
		ents, err := dir.f.ReadDir(128)
		for _, e := range ents {
			if *budget <= 0 {
				return errBudget
			}
			*budget--
			name := e.Name()
			if !e.IsDir() {
				err := unix.Unlinkat(dir.fd, name, 0)
				if err == nil || errors.Is(err, unix.ENOENT) {
					continue
				}
				if errors.Is(err, unix.EBUSY) {
					// A user's mount on a file: detached, and the file
					// removed by the next pass.
					if err := detachMount(dir.fd, name); err != nil {
						return err
					}
					continue
				}
				if !errors.Is(err, unix.EISDIR) {
					return err
				}
			}
			if depth >= maxOpenDepth {
				if err := unix.Renameat2(dir.fd, name, top.fd, fmt.Sprintf(".gpulet-sweep-%d", l.trash.Add(1)), unix.RENAME_NOREPLACE); err != nil {
					return err
				}
				continue
			}
			sub, err := openDirAt(dir.fd, name)
			switch {
			case errors.Is(err, unix.ENOENT):
				continue
			case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
				// Swapped for something else since listed: next pass.
				continue
			case errors.Is(err, unix.EACCES):
				// A user's FUSE mount, which root may not open: detached,
				// and the folder under it cleared by the next pass.
				if err := detachMount(dir.fd, name); err != nil {
					return err
				}
				continue
			case err != nil:
				return err
			}
			err = l.clearDir(top, sub, depth+1, budget)
			sub.Close()
			if err != nil {
				return err
			}
			err = unix.Unlinkat(dir.fd, name, unix.AT_REMOVEDIR)
			if errors.Is(err, unix.EBUSY) {
				// Mounted on since it was opened: as above.
				err = detachMount(dir.fd, name)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(ents) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// detachMount lazily unmounts the file system mounted at name in the folder
// dirfd, the top one where several are, without following a symlink at
// name: the folder is reached through its descriptor, never by a path that
// could be swapped meanwhile.
func detachMount(dirfd int, name string) error {
	return unix.Unmount(fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, name), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "folder"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	}
	return fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
}

// logWatchNotes logs what the watch noted since the last call.
func (l *Ledger) logWatchNotes() {
	if n := l.lost.Swap(0); n > 0 {
		l.watchLog.Log(slog.LevelWarn, "pipe-file ledger: inotify events were lost (a burst of entries); every unit name was looked at again", "times", n)
	}
	if n := l.watchErrs.Swap(0); n > 0 {
		msg := ""
		if p := l.lastWatchErr.Load(); p != nil {
			msg = *p
		}
		l.watchLog.Log(slog.LevelError, "pipe-file ledger: watch errors; every unit name was looked at again", "times", n, "last", msg)
	}
	for idx := range l.folderGone {
		if l.folderGone[idx].Swap(false) {
			g, k := idx/l.model.InstancesPerGPU, idx%l.model.InstancesPerGPU
			l.watchLog.Log(slog.LevelError, "pipe-file ledger: an instance folder was removed or moved; offline claims there are no longer seen until gpuletd restarts",
				"dir", filepath.Clean(l.InstanceDir(g, k)))
		}
	}
}
