package mpsctl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gpulet/gpulet/internal/statefile"
)

// logNames are the files the control daemon keeps open in an instance's log
// folder, both with O_APPEND (seen in /proc/<pid>/fdinfo).
var logNames = []string{"control.log", "server.log"}

// trimLog keeps dir/name within limit bytes. A longer file has its last quarter of
// limit (from the start of a line) kept in name.1, which it replaces, and is then
// truncated in place: the daemon writes with O_APPEND, so its next line lands at
// the new end of the same file and nothing has to reopen it. Lines written between
// the copy and the truncation are lost. It returns the size the file had when it
// was cut, 0 when it was not.
//
// The log folder may be writable by MPS clients, so nothing found there is
// trusted: only a regular file owned by our euid with one link is cut (never a
// symlink's target, a hard link to some other file, a FIFO or a device), and
// name.1 is written under a fresh name and renamed into place, which replaces
// whatever had that name without following it. A copy that fails (a full disk)
// does not stop the truncation, which is what frees the space.
func trimLog(dir, name string, limit int64) (int64, error) {
	p := filepath.Join(dir, name)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// Cheap on every check: most of the time this is where it ends.
	if !fi.Mode().IsRegular() || fi.Size() <= limit {
		return 0, nil
	}
	// O_NONBLOCK: should a FIFO replace the file after the Lstat, the open must not
	// wait for a writer.
	f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	ffi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	st, ok := ffi.Sys().(*syscall.Stat_t)
	if !ok || !ffi.Mode().IsRegular() || !os.SameFile(fi, ffi) || st.Nlink != 1 || st.Uid != uint32(os.Geteuid()) {
		// Not the daemon's file: someone replaced or linked it. Not ours to cut.
		return 0, nil
	}
	size := ffi.Size()
	copyErr := keepTail(f, size, limit/4, p+".1")
	if err := f.Truncate(0); err != nil {
		return 0, errors.Join(fmt.Errorf("truncating: %w", err), copyErr)
	}
	return size, copyErr
}

// keepTail writes the last keep bytes of f (size bytes long), from the first line
// start among them, to dst through a fresh file renamed into place.
func keepTail(f *os.File, size, keep int64, dst string) error {
	off := max(size-keep, 0)
	buf := make([]byte, size-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading: %w", err)
	}
	buf = buf[:n]
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	// A new file under a random name (O_EXCL): nothing planted in the
	// folder is opened.
	if err := statefile.Replace(dst, buf, 0o644); err != nil {
		return fmt.Errorf("keeping the end in %s: %w", dst, err)
	}
	return nil
}

// trimLogs keeps the instance's log files within MaxLog. The daemon need not run:
// its files stay behind when it dies.
func (d *Daemons) trimLogs(in *instance) {
	for _, name := range logNames {
		size, err := trimLog(in.logDir, name, d.cfg.MaxLog)
		if err != nil {
			in.log.Warn("cannot trim MPS log", "file", filepath.Join(in.logDir, name), "err", err)
		}
		if size > 0 {
			in.log.Info("MPS log trimmed", "file", filepath.Join(in.logDir, name), "size", size, "kept_in", name+".1")
		}
	}
}
