// Package statefile replaces files whole: durably for gpuletd's state dir,
// whose files must survive a crash or a reboot whole, and without the fsyncs
// for the run dir's; and it sets aside one that cannot be read.
package statefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Write replaces path with data durably: a new file beside it (never
// following a link: it is made afresh), written and fsynced, renamed over
// path, and the folder fsynced. A reader, a crash or a full disk finds the old
// file or the new one, never a part of either; when a step before the rename
// fails the old file stays as it was. Only the folder's fsync comes after it:
// when that fails (an I/O error of the disk), the new file is in place, and
// may or may not be what a crash leaves.
func Write(path string, data []byte, mode os.FileMode) error { return replace(path, data, mode, true) }

// Replace is Write without the fsyncs, for the files of the run dir, which a
// reboot clears anyway: a reader still sees the old content or the new one,
// never a part, and a failed step leaves the old file as it was.
func Replace(path string, data []byte, mode os.FileMode) error {
	return replace(path, data, mode, false)
}

func replace(path string, data []byte, mode os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return fail(err)
		}
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return err
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return err
	}
	if !durable {
		return nil
	}
	return syncDir(dir)
}

// RemoveTemps removes the temporary files that a writer of path killed
// between making one and renaming it over path left beside it: nothing else
// ever would, and each holds room. The caller must be path's only writer. It
// removes regular files only, named as replace names them.
func RemoveTemps(path string) error {
	dir, prefix := filepath.Dir(path), "."+filepath.Base(path)+"."
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || rest == "" || strings.Trim(rest, "0123456789") != "" || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SetAside renames a file that cannot be used whole to a name beside it
// (path.damaged, with a time when that is taken), so that the next Write does
// not overwrite what it held: an operator can look at it. It returns the new
// name.
func SetAside(path string) (string, error) {
	aside := path + ".damaged"
	if _, err := os.Lstat(aside); err == nil {
		aside += "-" + time.Now().UTC().Format("20060102T150405.000000000")
	}
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
