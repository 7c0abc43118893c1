// Package slurmjob finds the Slurm job a process runs in, from its own cgroup,
// and tells when that job has left the node. Slurm's cgroup plugins put every
// process of a job under a folder of the job that only root (slurmstepd) makes:
//
//	cgroup v1: /<controller>/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>/task_<n>
//	cgroup v2: /system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<step>/user/task_<n>
//
// A job's environment (SLURM_JOB_ID) is the job user's to change; its cgroup
// is not, so the cgroup is what names the job.
package slurmjob

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpulet/gpulet/internal/procfs"
)

// ErrNoJob means the process is in no Slurm job's cgroup.
var ErrNoJob = errors.New("the process is in no Slurm job's cgroup")

// Bounds on what is read, so that a strange cgroup file or tree cannot make the
// daemon keep or walk much.
const (
	maxCgroupFile = 64 << 10
	maxWalk       = 4096
)

// Job is the Slurm job a process runs in, as its cgroup names it.
type Job struct {
	ID uint64
	// Step is the step's name after "step_" ("0", "batch", "extern");
	// empty when the process is in the job's cgroup but in no step's.
	Step string
	// UID is the job's user where the layout names it (v1); -1 otherwise.
	UID int64
	// Hierarchy is the folder of the job's cgroup hierarchy under the
	// cgroup root: the controller's ("freezer") for v1, "" for v2.
	Hierarchy string
	// Path is the job's cgroup inside its hierarchy, "/slurm/uid_0/job_12".
	Path string
}

// Parse reads /proc/<pid>/cgroup and finds the process's job. Of a v1 process,
// the freezer hierarchy's line is preferred (proctrack/cgroup's); every line
// that names a job must name the same one.
func Parse(procCgroup []byte) (Job, error) {
	if len(procCgroup) > maxCgroupFile {
		return Job{}, fmt.Errorf("cgroup file longer than %d bytes", maxCgroupFile)
	}
	var found []Job
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	sc.Buffer(make([]byte, 0, 4096), maxCgroupFile)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return Job{}, fmt.Errorf("cgroup line %q: want ID:CONTROLLERS:PATH", line)
		}
		j, ok, err := parseLine(parts[0], parts[1], parts[2])
		if err != nil {
			return Job{}, err
		}
		if ok {
			found = append(found, j)
		}
	}
	if err := sc.Err(); err != nil {
		return Job{}, fmt.Errorf("cgroup file: %w", err)
	}
	if len(found) == 0 {
		return Job{}, ErrNoJob
	}
	best := found[0]
	for _, j := range found {
		if j.ID != best.ID || j.Step != best.Step {
			return Job{}, fmt.Errorf("cgroup hierarchies disagree: job %d step %q and job %d step %q", best.ID, best.Step, j.ID, j.Step)
		}
		if j.Hierarchy == "freezer" {
			best = j
		}
	}
	return best, nil
}

// parseLine finds a job in one line of /proc/<pid>/cgroup; ok is false when
// the line names none.
func parseLine(id, controllers, path string) (Job, bool, error) {
	if !strings.HasPrefix(path, "/") {
		return Job{}, false, fmt.Errorf("cgroup path %q is not absolute", path)
	}
	comps := strings.Split(strings.Trim(path, "/"), "/")
	for _, c := range comps {
		if c == "." || c == ".." {
			// The kernel writes no such path; it would lead out of the job.
			return Job{}, false, fmt.Errorf("cgroup path %q is not clean", path)
		}
	}
	for i, c := range comps {
		num, isJob := strings.CutPrefix(c, "job_")
		if !isJob || i == 0 {
			continue
		}
		jobID, err := strconv.ParseUint(num, 10, 64)
		if err != nil || jobID == 0 {
			continue
		}
		j := Job{ID: jobID, UID: -1, Path: "/" + strings.Join(comps[:i+1], "/")}
		parent := comps[i-1]
		switch {
		case id == "0" && controllers == "":
			if !strings.HasSuffix(parent, "slurmstepd.scope") {
				continue
			}
		default:
			uid, isUID := strings.CutPrefix(parent, "uid_")
			if !isUID || i < 2 || !strings.HasPrefix(comps[i-2], "slurm") {
				continue
			}
			n, err := strconv.ParseUint(uid, 10, 32)
			if err != nil {
				continue
			}
			j.UID = int64(n)
			j.Hierarchy = hierarchyFolder(controllers)
			if j.Hierarchy == "" {
				return Job{}, false, fmt.Errorf("cgroup line of job %d names no controller", jobID)
			}
		}
		if i+1 < len(comps) {
			if step, ok := strings.CutPrefix(comps[i+1], "step_"); ok && step != "" {
				j.Step = step
			}
		}
		return j, true, nil
	}
	return Job{}, false, nil
}

// hierarchyFolder is where a v1 hierarchy is mounted under the cgroup root, as
// systemd and Slurm mount them: "name=systemd" at "systemd", "cpu,cpuacct" at
// "cpu,cpuacct".
func hierarchyFolder(controllers string) string {
	if name, ok := strings.CutPrefix(controllers, "name="); ok {
		return name
	}
	if strings.ContainsAny(controllers, "/") || controllers == "." || controllers == ".." {
		return ""
	}
	return controllers
}

// Dir is the folder of the job's cgroup under the cgroup root (normally
// /sys/fs/cgroup).
func (j Job) Dir(root string) string {
	return filepath.Join(root, j.Hierarchy, filepath.FromSlash(j.Path))
}

// StepDir is the folder of the step's cgroup; "" when the process is in no
// step's.
func (j Job) StepDir(root string) string {
	if j.Step == "" {
		return ""
	}
	return filepath.Join(j.Dir(root), "step_"+j.Step)
}

// CheckMadeBySlurm refuses a cgroup folder that root did not make or that
// others may change: where a user may make cgroups of their own (a delegated
// v2 subtree), a folder they named job_<id> is theirs, not Slurm's.
func CheckMadeBySlurm(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("%s is not a folder", dir)
	}
	if st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is not Slurm's: owned by uid %d with mode %v, want root's and writable by root only", dir, st.Uid, fi.Mode().Perm())
	}
	return nil
}

// Ended reports whether the job (or step) whose cgroup is dir has left the
// node: its folder is gone, or no process but Slurm's own slurmstepd is left
// in it or below it. slurmstepd stays in the job's cgroup for a second or so
// after the job's last process, reporting and cleaning up; it holds no GPU.
// A v2 cgroup that says "populated 0" (cgroup.events) is not walked.
func Ended(dir string) (bool, error) {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return true, nil
	} else if err != nil {
		return false, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil {
		populated, ok := eventsPopulated(b)
		if !ok {
			return false, fmt.Errorf("%s/cgroup.events has no populated line", dir)
		}
		if !populated {
			return true, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return gone(dir, err)
	}
	walked := 0
	found := errors.New("a process is in the cgroup")
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p != dir {
			// A step's folder removed while the walk reads its parent.
			return fs.SkipDir
		}
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if walked++; walked > maxWalk {
			return fmt.Errorf("more than %d cgroup folders under %s", maxWalk, dir)
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) && p != dir {
			// Removed while the walk reads it: the walk finds its folders
			// gone too.
			return nil
		}
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err != nil || !IsSlurmstepd(pid) {
				return found
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, found):
		return false, nil
	case err != nil:
		// Slurm removes a step's folder while the walk reads it.
		return gone(dir, err)
	}
	return true, nil
}

// IsSlurmstepd reports whether pid is Slurm's step daemon: a process named
// slurmstepd whose real uid is root's. A job's user can name a process so,
// even a set-user-ID one, but not give it root's real uid.
func IsSlurmstepd(pid int) bool {
	if comm, err := procfs.Comm(pid); err != nil || comm != "slurmstepd" {
		return false
	}
	uid, err := procfs.RealUID(pid)
	return err == nil && uid == 0
}

// gone answers a read that failed: a folder removed meanwhile has ended.
func gone(dir string, err error) (bool, error) {
	if _, serr := os.Lstat(dir); errors.Is(serr, fs.ErrNotExist) {
		return true, nil
	}
	return false, err
}

// eventsPopulated reads the "populated" line of a v2 cgroup.events file.
func eventsPopulated(b []byte) (populated, ok bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(line, "populated "); found {
			return strings.TrimSpace(v) != "0", true
		}
	}
	return false, false
}
