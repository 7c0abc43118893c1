package procfs

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// LockedFile names a file as /proc/locks does: its device and inode.
type LockedFile struct {
	Major, Minor uint32
	Inode        uint64
}

// FlockHolders reads which process holds a flock(2) on each file, from
// /proc/locks. An offline claim keeps its FIFO locked for its whole life,
// and this is how its process is told without asking every process.
func FlockHolders() (map[LockedFile]int, error) {
	f, err := os.Open("/proc/locks")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseLocks(f)
}

// ParseLocks parses /proc/locks, keeping the granted FLOCK locks:
//
//	1: FLOCK  ADVISORY  WRITE 4242 00:19:5678 0 EOF
//
// A waiter's line ("1: -> FLOCK ...") holds nothing and is skipped, as are
// POSIX and OFD locks and malformed lines.
func ParseLocks(r io.Reader) (map[LockedFile]int, error) {
	out := map[LockedFile]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || pid <= 0 {
			continue
		}
		dev := strings.Split(f[5], ":")
		if len(dev) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(dev[0], 16, 32)
		min, err2 := strconv.ParseUint(dev[1], 16, 32)
		ino, err3 := strconv.ParseUint(dev[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out[LockedFile{Major: uint32(maj), Minor: uint32(min), Inode: ino}] = pid
	}
	return out, sc.Err()
}
