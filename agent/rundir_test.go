package agent

import (
	"bufio"
	"fmt"
	"os/exec"
	"testing"
)

// A second lock of the run dir names the process that holds it, as
// /proc/locks tells it: flock(1) here, in a process of its own, as another
// gpuletd would be.
func TestLockRunDirNamesTheHolder(t *testing.T) {
	dir := t.TempDir()
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1) to hold the lock from another process")
	}
	holder := exec.Command("flock", "-n", dir+"/gpuletd.lock", "sh", "-c", "echo locked; exec sleep 30")
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "locked\n" {
		t.Fatalf("flock(1) said %q, %v", line, err)
	}
	_, err = lockRunDir(dir)
	want := fmt.Sprintf("another gpuletd (pid %d) is already running with --run-dir %s", holder.Process.Pid, dir)
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
