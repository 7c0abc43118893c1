package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/internal/procfs"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestClaimFollowsItsDescriptor: a claimer that exits leaving its claim to
// a child it started. /proc/locks keeps naming the claimer's pid, now dead
// (or reused); the snapshot must name the child, which holds the claim's
// descriptor, as the claim's process.
func TestClaimFollowsItsDescriptor(t *testing.T) {
	d := e2e.Start(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	run := exec.Command(e2e.Bin("gpurun"), "--offline", "--run-dir", d.RunDir, "--", "sh", "-c",
		`sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$0"`, pidFile)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("gpurun --offline: %v\n%s", err, out)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := os.FindProcess(child); err == nil {
		t.Cleanup(func() { p.Kill() })
	}
	claimer := run.Process.Pid
	var got []int
	testutil.Eventually(t, "the claim charged to the child holding it", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		if err != nil || len(s.GPUs[0].Claims) != 1 {
			return false
		}
		got = append(got, s.GPUs[0].Claims[0].PID)
		return s.GPUs[0].Claims[0].PID == child
	})
	for _, pid := range got {
		if pid == claimer {
			t.Fatalf("the claim was charged to its exited claimer %d (pids seen %v)", claimer, got)
		}
	}
}

// TestDoubleForkStaysUnderTheLease: a lease's command starts a process that
// double-forks away from it, as a daemon does. gpurun makes the command its
// descendants' subreaper, so the process is re-parented to the lease's
// process, where accounting finds it, and not to init.
func TestDoubleForkStaysUnderTheLease(t *testing.T) {
	d := e2e.Start(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	run := exec.Command(e2e.Bin("gpurun"), "--socket", d.Socket, "--", "sh", "-c",
		`sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$0"' "$0"; exec sleep 300`, pidFile)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	var orphan int
	testutil.Eventually(t, "the orphan's pid written", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		orphan, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if p, err := os.FindProcess(orphan); err == nil {
		t.Cleanup(func() { p.Kill() })
	}
	var parent int
	testutil.Eventually(t, "the orphan re-parented", func() bool {
		st, err := procfs.ReadStat(orphan)
		if err != nil {
			return false
		}
		parent = st.PPID
		// Its own parent, the inner shell, has exited.
		return parent != 0 && parent != orphan && !isChildShell(parent, run.Process.Pid)
	})
	if parent != run.Process.Pid {
		t.Fatalf("the double-forked process %d went to %d, not to the lease's process %d", orphan, parent, run.Process.Pid)
	}
}

// isChildShell says whether pid is a child of lease, the inner shell that
// starts the orphan and exits.
func isChildShell(pid, lease int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.PPID == lease
}
