package ledger

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/pipefile"
)

// Names in the instance folders other than their unit names ("strays"):
// gpuletd makes none, and the claim protocol makes only a FIFO under a
// temporary name, for the few system calls of a claim. Anything else there
// (a dot-file filling the run dir, a folder, a socket) is swept like junk at a
// unit name, and so is a FIFO left past strayFIFOGrace: every member of the
// socket group can write these folders, and the run dir is a small tmpfs that
// the lease journal needs.
const (
	// strayFIFOGrace is how long a FIFO at a name that is no unit name of its
	// folder stays: far longer than any claim takes between making its
	// temporary name and removing it.
	strayFIFOGrace = time.Minute
	// defaultStrayReads bounds the names one Sweep reads in each instance
	// folder besides its unit names; a bigger folder is read on by the next
	// Sweeps from where this one stopped, so that a flood of names costs each
	// sample interval a bounded time, and every folder gets its turn.
	defaultStrayReads = 1024
)

// sweepStrays reads on through each instance folder's names, within the
// read budget per folder, and removes the strays among them; budget is the
// Sweep's budget of entries deleted.
func (l *Ledger) sweepStrays(budget *int) []Removed {
	var out []Removed
	for _, g := range l.gpus {
		for k := range l.dirs[g.Index] {
			out = l.sweepStraysIn(out, g.Index, k, budget)
		}
	}
	return out
}

// sweepStraysIn reads on through the names of instance folder k of GPU g.
func (l *Ledger) sweepStraysIn(out []Removed, g, k int, budget *int) []Removed {
	d := l.strays[g][k]
	if d == nil {
		var err error
		if d, err = openDirAt(l.dirs[g][k].FD(), "."); err != nil {
			l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: cannot list an instance folder", "dir", l.InstanceDir(g, k), "err", err)
			return out
		}
		l.strays[g][k] = d
	}
	for reads := l.strayReads; reads > 0 && *budget > 0; {
		ents, err := d.f.ReadDir(min(128, reads))
		reads -= len(ents)
		for _, e := range ents {
			if r, ok := l.sweepStray(g, k, e.Name(), budget); ok {
				out = append(out, r)
			}
		}
		if err != nil || len(ents) == 0 {
			if !errors.Is(err, io.EOF) && err != nil {
				l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: cannot list an instance folder", "dir", l.InstanceDir(g, k), "err", err)
			}
			// From the start again at the next Sweep.
			if _, err := d.f.Seek(0, io.SeekStart); err != nil {
				d.Close()
				l.strays[g][k] = nil
			}
			return out
		}
	}
	return out
}

// sweepStray removes name from instance folder k of GPU g when it is a
// stray, and logs it with its owner's uid and, for a file, its size.
func (l *Ledger) sweepStray(g, k int, name string, budget *int) (Removed, bool) {
	if i, ok := pipefile.ParseUnitName(name, l.model.UnitsPerGPU); ok && l.model.InstanceOf(i) == k {
		return Removed{}, false // Sweep's own loop looks at unit names
	}
	dir := l.dirs[g][k]
	path := filepath.Join(l.InstanceDir(g, k), name)
	st, err := l.lstatDetaching(dir.FD(), name, path)
	if err != nil {
		return Removed{}, false
	}
	if pipefile.IsFIFO(&st) && l.now().Sub(time.Unix(st.Ctim.Unix())) < strayFIFOGrace {
		return Removed{}, false
	}
	if err := l.removeEntry(dir.FD(), name, &st, budget); err != nil {
		if !errors.Is(err, errBudget) {
			l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: cannot remove an entry gpuletd did not make", "path", path, "uid", st.Uid, "err", err)
		}
		return Removed{}, false
	}
	r := Removed{GPU: g, Instance: k, Unit: -1, Path: path, Type: typeName(st.Mode), UID: st.Uid}
	attrs := []any{"path", r.Path, "type", r.Type, "uid", r.UID}
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		attrs = append(attrs, "bytes", st.Size)
	}
	l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: removed an entry gpuletd did not make, at a name that is no unit name of its folder", attrs...)
	return r, true
}

// lstatDetaching describes the entry name of folder dirfd without following
// it. Root may look at anything but a local user's FUSE mount, which
// fusermount3 lets them put on a folder or file of their own: no claim, and
// nothing else would ever remove it. It is detached (one mount on another at a
// time), and what it was mounted on is described.
func (l *Ledger) lstatDetaching(dirfd int, name, path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	for n := 0; errors.Is(err, unix.EACCES) && n < maxOpenDepth; n++ {
		if derr := detachMount(dirfd, name); derr != nil {
			l.sweptLog.Log(slog.LevelWarn, "pipe-file ledger: cannot detach a mount in an instance folder", "path", path, "err", derr)
			break
		}
		err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	return st, err
}
