package procfs

import (
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// File names a file by its device and inode, as stat(2) gives them.
type File struct {
	Dev, Ino uint64
}

// Holds reports whether process pid holds a descriptor on f, a file under
// the folder under (see Holders).
func Holds(pid int, f File, under string) bool {
	found := false
	eachFile(pid, under, func(got File) bool {
		found = got == f
		return !found
	})
	return found
}

// Holders lists, for each of files, the processes that hold a descriptor on
// it, in pid order: what /proc/locks cannot tell once the process that took
// a lock has passed its descriptor on and exited. It reads every process's
// descriptors, so it is for when the cheaper Holds said no. Only
// descriptors whose path lies under the folder under are looked at (their
// link read, never the file behind another descriptor touched), so that a
// descriptor on a file of a stalled FUSE mount cannot stall the walk.
func Holders(files map[File]bool, under string) (map[File][]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	out := map[File][]int{}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		eachFile(pid, under, func(f File) bool {
			if files[f] && !slices.Contains(out[f], pid) {
				out[f] = append(out[f], pid)
			}
			return true
		})
	}
	for f := range out {
		slices.Sort(out[f])
	}
	return out, nil
}

// eachFile calls fn with each file under the folder under that pid holds a
// descriptor on, until fn returns false. A process gone, or one whose
// descriptors may not be read, holds nothing.
func eachFile(pid int, under string, fn func(File) bool) {
	dirfd, err := unix.Open(path(pid, "fd"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	dir := os.NewFile(uintptr(dirfd), "fd")
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return
	}
	prefix := strings.TrimSuffix(under, "/") + "/"
	buf := make([]byte, unix.PathMax)
	for _, name := range names {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), prefix) {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, 0) != nil {
			continue
		}
		if !fn(File{Dev: st.Dev, Ino: st.Ino}) {
			return
		}
	}
}
