package slurmjob

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

const v1Task = `9:name=systemd:/
8:pids:/
6:freezer:/slurm_node1/uid_1000/job_12/step_0/task_0
5:devices:/slurm_node1/uid_1000/job_12/step_0/task_0
4:memory:/process_api/44b8
0::/
`

const v2Task = "0::/system.slice/node1_slurmstepd.scope/job_7/step_batch/user/task_0\n"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Job
		err      error
	}{
		{"v1 task", v1Task, Job{ID: 12, Step: "0", UID: 1000, Hierarchy: "freezer", Path: "/slurm_node1/uid_1000/job_12"}, nil},
		{"v1 devices only", "5:devices:/slurm/uid_5/job_3/step_extern\n", Job{ID: 3, Step: "extern", UID: 5, Hierarchy: "devices", Path: "/slurm/uid_5/job_3"}, nil},
		{"v1 job folder", "6:freezer:/slurm/uid_5/job_3\n", Job{ID: 3, UID: 5, Hierarchy: "freezer", Path: "/slurm/uid_5/job_3"}, nil},
		{"v1 named", "1:name=systemd:/slurm/uid_5/job_3/step_0\n", Job{ID: 3, Step: "0", UID: 5, Hierarchy: "systemd", Path: "/slurm/uid_5/job_3"}, nil},
		{"v2 task", v2Task, Job{ID: 7, Step: "batch", UID: -1, Path: "/system.slice/node1_slurmstepd.scope/job_7"}, nil},
		{"not in a job", "0::/user.slice/user-1000.slice/session-1.scope\n", Job{}, ErrNoJob},
		{"v2 job_ outside slurmstepd", "0::/user.slice/user-1000.slice/user@1000.service/job_7/step_0\n", Job{}, ErrNoJob},
		{"v1 job_ without uid", "6:freezer:/slurm/job_3/step_0\n", Job{}, ErrNoJob},
		{"v1 job_ outside slurm", "6:freezer:/mine/uid_5/job_3/step_0\n", Job{}, ErrNoJob},
		{"job zero", "6:freezer:/slurm/uid_5/job_0/step_0\n", Job{}, ErrNoJob},
		{"empty", "", Job{}, ErrNoJob},
	} {
		got, err := Parse([]byte(tc.in))
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"disagreeing hierarchies": "6:freezer:/slurm/uid_5/job_3/step_0\n5:devices:/slurm/uid_5/job_4/step_0\n",
		"no path":                 "6:freezer\n",
		"relative path":           "6:freezer:slurm/uid_5/job_3\n",
		"controller with a slash": "6:../x:/slurm/uid_5/job_3\n",
		"dot-dot in the path":     "6:freezer:/../../slurm/uid_5/job_3\n",
		"too long":                string(make([]byte, maxCgroupFile+1)),
	} {
		if j, err := Parse([]byte(in)); err == nil || errors.Is(err, ErrNoJob) {
			t.Errorf("%s: got %+v, %v; want a parse error", name, j, err)
		}
	}
}

func TestDirs(t *testing.T) {
	j, err := Parse([]byte(v1Task))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := j.Dir("/sys/fs/cgroup"), "/sys/fs/cgroup/freezer/slurm_node1/uid_1000/job_12"; got != want {
		t.Errorf("Dir = %s, want %s", got, want)
	}
	if got, want := j.StepDir("/sys/fs/cgroup"), "/sys/fs/cgroup/freezer/slurm_node1/uid_1000/job_12/step_0"; got != want {
		t.Errorf("StepDir = %s, want %s", got, want)
	}
	j2, _ := Parse([]byte(v2Task))
	if got, want := j2.Dir("/cg"), "/cg/system.slice/node1_slurmstepd.scope/job_7"; got != want {
		t.Errorf("v2 Dir = %s, want %s", got, want)
	}
	if (Job{ID: 1}).StepDir("/cg") != "" {
		t.Error("StepDir of a process in no step is not empty")
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A v1 job has ended when no cgroup.procs under its folder lists a process,
// or when the folder is gone.
func TestEndedV1(t *testing.T) {
	job := filepath.Join(t.TempDir(), "freezer", "slurm", "uid_5", "job_3")
	write(t, filepath.Join(job, "cgroup.procs"), "")
	write(t, filepath.Join(job, "step_0", "cgroup.procs"), "")
	write(t, filepath.Join(job, "step_0", "task_0", "cgroup.procs"), "4242\n")
	if ended, err := Ended(job); err != nil || ended {
		t.Fatalf("a process in a task: ended %v, %v; want running", ended, err)
	}
	write(t, filepath.Join(job, "step_0", "task_0", "cgroup.procs"), "")
	if ended, err := Ended(job); err != nil || !ended {
		t.Fatalf("no process left: ended %v, %v; want ended", ended, err)
	}
	if err := os.RemoveAll(job); err != nil {
		t.Fatal(err)
	}
	if ended, err := Ended(job); err != nil || !ended {
		t.Fatalf("folder gone: ended %v, %v; want ended", ended, err)
	}
}

func TestEndedV2(t *testing.T) {
	job := filepath.Join(t.TempDir(), "system.slice", "slurmstepd.scope", "job_7")
	write(t, filepath.Join(job, "cgroup.events"), "populated 1\nfrozen 0\n")
	// Under v2 only leaves hold processes (pid 1 stands for the task).
	write(t, filepath.Join(job, "cgroup.procs"), "")
	write(t, filepath.Join(job, "step_0", "user", "task_0", "cgroup.procs"), "1\n")
	if ended, err := Ended(job); err != nil || ended {
		t.Fatalf("populated 1: ended %v, %v; want running", ended, err)
	}
	write(t, filepath.Join(job, "cgroup.events"), "populated 0\nfrozen 0\n")
	if ended, err := Ended(job); err != nil || !ended {
		t.Fatalf("populated 0: ended %v, %v; want ended", ended, err)
	}
	write(t, filepath.Join(job, "cgroup.events"), "frozen 0\n")
	if _, err := Ended(job); err == nil {
		t.Fatal("cgroup.events without a populated line: no error")
	}
}

func TestCheckMadeBySlurm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make folders of root and of another user")
	}
	dir := filepath.Join(t.TempDir(), "job_3")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckMadeBySlurm(dir); err != nil {
		t.Fatalf("root's folder 0755: %v", err)
	}
	if err := os.Chmod(dir, 0o775); err != nil {
		t.Fatal(err)
	}
	if err := CheckMadeBySlurm(dir); err == nil {
		t.Error("a group-writable folder is taken for Slurm's")
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := CheckMadeBySlurm(dir); err == nil {
		t.Error("a user's folder is taken for Slurm's")
	}
	link := filepath.Join(filepath.Dir(dir), "link")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	if err := CheckMadeBySlurm(link); err == nil {
		t.Error("a symlink is taken for Slurm's folder")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{v1Task, v2Task, "", "0::/\n", "6:freezer:/slurm/uid_5/job_3\n", "x:y:z", "6:freezer:/../../slurm/uid_5/job_3\n", "6:name=:/slurm/uid_1/job_1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := Parse(b)
		if err != nil {
			return
		}
		if j.ID == 0 || j.Path == "" || j.Path[0] != '/' {
			t.Fatalf("Parse(%q) = %+v: no job id or a relative path", b, j)
		}
		if filepath.Clean(j.Dir("/root")) != j.Dir("/root") || !filepath.IsAbs(j.Dir("/root")) {
			t.Fatalf("Parse(%q): Dir %q is not clean", b, j.Dir("/root"))
		}
		if rel, err := filepath.Rel("/root", j.Dir("/root")); err != nil || rel == ".." || len(rel) > 2 && rel[:3] == "../" {
			t.Fatalf("Parse(%q): Dir %q leaves the cgroup root", b, j.Dir("/root"))
		}
	})
}

// TestEndedIgnoresSlurmstepd: slurmstepd (root's) lingers in the job's cgroup
// after the job's last process; a process of the user's named so does not.
func TestEndedIgnoresSlurmstepd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process named slurmstepd as root and as another user")
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "slurmstepd")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep:", err)
	}
	if err := os.Symlink(sleep, link); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	start := func(uid uint32) int {
		cmd := exec.Command(link, "60")
		if uid != 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	roots, users := start(0), start(4242)
	job := filepath.Join(dir, "job_3")
	write(t, filepath.Join(job, "cgroup.procs"), fmt.Sprintf("%d\n", roots))
	if ended, err := Ended(job); err != nil || !ended {
		t.Fatalf("only root's slurmstepd left: ended %v, %v; want ended", ended, err)
	}
	write(t, filepath.Join(job, "step_0", "cgroup.procs"), fmt.Sprintf("%d\n", users))
	if ended, err := Ended(job); err != nil || ended {
		t.Fatalf("a user's process named slurmstepd: ended %v, %v; want running", ended, err)
	}
}
