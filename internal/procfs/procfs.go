// Package procfs is gpulet's one reader of /proc/<pid>: a process's state and
// start time from its stat file, its real uid from its status file, its
// executable, its cgroups and its name; and of the daemon's own open
// descriptors (/proc/self/fd). Who an API caller is never comes from here (it comes from
// the socket); this is for watching processes, finding MPS daemons, and the
// Slurm job of the process the socket's pidfd holds.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrNoProcess means no process has that pid.
var ErrNoProcess = errors.New("no such process")

func path(pid int, file string) string { return "/proc/" + strconv.Itoa(pid) + "/" + file }

// Stat is what gpulet reads of /proc/<pid>/stat.
type Stat struct {
	// State is the state letter: R, S, D, T, Z, X, ...
	State byte
	// PPID is the parent's pid (field 4).
	PPID int
	// StartTime is in clock ticks since boot (field 22): with the pid, it
	// names one process across pid reuse.
	StartTime uint64
}

// Exited reports whether the process is a zombie or dead: it runs no more,
// though its pid is not free yet.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat reads /proc/<pid>/stat.
func ReadStat(pid int) (Stat, error) {
	if pid <= 0 {
		return Stat{}, ErrNoProcess
	}
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrInvalid) {
			return Stat{}, ErrNoProcess
		}
		return Stat{}, err
	}
	return ParseStat(b)
}

// ParseStat parses the content of a stat file. The command name (field 2) may
// hold spaces and parentheses, so fields are counted after the last ')'.
func ParseStat(b []byte) (Stat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return Stat{}, errors.New("procfs: malformed stat: no command name")
	}
	fields := strings.Fields(string(b[end+1:]))
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 {
		return Stat{}, errors.New("procfs: malformed stat: too few fields")
	}
	// The kernel's states are single letters (R, S, D, Z, T, t, X, I, ...).
	if state := fields[0]; len(state) != 1 || !isASCIILetter(state[0]) {
		return Stat{}, fmt.Errorf("procfs: malformed stat: state %q", state)
	}
	st, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("procfs: malformed stat: start time %q", fields[19])
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil || ppid < 0 {
		return Stat{}, fmt.Errorf("procfs: malformed stat: parent %q", fields[1])
	}
	return Stat{State: fields[0][0], PPID: ppid, StartTime: st}, nil
}

func isASCIILetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// RealUID reads the real uid of pid from /proc/<pid>/status.
func RealUID(pid int) (uint32, error) {
	f, err := os.Open(path(pid, "status"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, ErrNoProcess
		}
		return 0, err
	}
	defer f.Close()
	return ParseRealUID(f)
}

// ParseRealUID finds the real uid in the content of a status file.
func ParseRealUID(r interface{ Read([]byte) (int, error) }) (uint32, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Uid:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			break
		}
		uid, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil {
			break
		}
		return uint32(uid), nil
	}
	return 0, errors.New("procfs: malformed status: no Uid line")
}

// SameExecutable reports whether pid runs the file at bin.
func SameExecutable(pid int, bin string) bool {
	exe, err := os.Stat(path(pid, "exe"))
	if err != nil {
		return false
	}
	fi, err := os.Stat(bin)
	return err == nil && os.SameFile(exe, fi)
}
