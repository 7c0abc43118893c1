package procfs

import (
	"errors"
	"io"
	"os"
	"strings"
)

// maxCgroupFile bounds what is read of /proc/<pid>/cgroup.
const maxCgroupFile = 64 << 10

// Cgroup reads /proc/<pid>/cgroup: the process's cgroup in each hierarchy,
// which tells a Slurm job's processes (agent/slurmjob parses it).
func Cgroup(pid int) ([]byte, error) {
	f, err := os.Open(path(pid, "cgroup"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNoProcess
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxCgroupFile {
		return nil, errors.New("procfs: cgroup file longer than 64 KiB")
	}
	return b, nil
}

// Comm reads /proc/<pid>/comm: the process's name, as it set it or as its
// program's file is named.
func Comm(pid int) (string, error) {
	b, err := os.ReadFile(path(pid, "comm"))
	if errors.Is(err, os.ErrNotExist) {
		return "", ErrNoProcess
	}
	return strings.TrimSuffix(string(b), "\n"), err
}
