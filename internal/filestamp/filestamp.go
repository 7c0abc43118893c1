// Package filestamp tells whether a file read before may have changed since,
// without reading it: for token files read again on every request when they
// change, and only then.
package filestamp

import (
	"os"
	"syscall"
)

// Stamp is what stat says of a file that any rewrite changes. Size and
// modification time alone miss a rewrite of the same length whose time was
// kept or set back (cp -p, touch -r, a coarse clock): the change time, which
// no user can set, and the inode, which an atomic replace (a new file renamed
// over the old, a mounted secret's symlink swap) changes, do not.
type Stamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
	ctime    syscall.Timespec
}

// Of is fi's stamp; fi must come from os.Stat or os.Lstat.
func Of(fi os.FileInfo) Stamp {
	s := Stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino, s.ctime = uint64(st.Dev), st.Ino, st.Ctim
	}
	return s
}
