package procwatch

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/testutil"
)

func TestWaitSeesExit(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, st, err := Open(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if st == 0 {
		t.Fatal("start time 0")
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	waitParked(t, done)
	select {
	case err := <-done:
		t.Fatalf("Wait returned before exit: %v", err)
	default:
	}
	cmd.Process.Kill()
	// Wait must see the exit even while the child is an unreaped zombie.
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the process was killed")
	}
	cmd.Wait()
}

func TestCloseEndsWait(t *testing.T) {
	p, _, err := Open(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	waitParked(t, done)
	select {
	case err := <-done:
		t.Fatalf("Wait returned before Close: %v", err)
	default:
	}
	p.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Wait returned nil after Close, want an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end Wait")
	}
}

// waitParked waits until a Wait started by the test blocks on the pidfd, or
// returns (done gets its result): only then has Wait looked at the process
// and found it running.
func waitParked(t *testing.T, done chan error) {
	t.Helper()
	testutil.Eventually(t, "Wait to block or return", func() bool {
		return len(done) > 0 || testutil.Parked("procwatch.(*Process).Wait")
	})
}

// sigIgnored reports whether process pid ignores sig (its SigIgn mask).
func sigIgnored(t *testing.T, pid int, sig syscall.Signal) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:\t"); ok {
			m, err := strconv.ParseUint(mask, 16, 64)
			return err == nil && m&(1<<(sig-1)) != 0
		}
	}
	return false
}

func TestReusedPidIsGone(t *testing.T) {
	st, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(os.Getpid(), st+1); !errors.Is(err, ErrGone) {
		t.Fatalf("Open with another start time: %v, want ErrGone", err)
	}
	p, got, err := Open(os.Getpid(), st)
	if err != nil || got != st {
		t.Fatalf("Open with the right start time: %v (start %d, want %d)", err, got, st)
	}
	p.Close()
}

func TestMissingProcessIsGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(cmd.Process.Pid, 0); !errors.Is(err, ErrGone) {
		t.Fatalf("Open of a reaped pid: %v, want ErrGone", err)
	}
}

// startAs starts a sleep as uid (root may pick any), killed when the test ends.
func startAs(t *testing.T, uid uint32) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if uid != uint32(os.Getuid()) {
		if os.Getuid() != 0 {
			t.Skip("needs root to start a process as another user")
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// otherThread is the id of a thread of this process that does not lead it.
func otherThread(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if tid, _ := strconv.Atoi(e.Name()); tid != 0 && tid != os.Getpid() {
			return tid
		}
	}
	t.Fatal("no thread besides the leader")
	return 0
}

func TestOpenOwned(t *testing.T) {
	const other = 65534
	me := uint32(os.Getuid())
	mine := startAs(t, me)
	theirs := startAs(t, other)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pid  int
		uid  uint32
		want error // nil: success
	}{
		{"own process", mine.Process.Pid, me, nil},
		{"another user's process", theirs.Process.Pid, me, ErrNotOwner},
		{"that user asking", theirs.Process.Pid, other, nil},
		{"reaped process", gone.Process.Pid, me, ErrGone},
		{"thread of a process", otherThread(t), me, ErrThread},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, st, err := OpenOwned(tc.pid, tc.uid)
			if tc.want == nil {
				if err != nil || st == 0 {
					t.Fatalf("OpenOwned(%d, %d) = start %d, %v", tc.pid, tc.uid, st, err)
				}
				p.Close()
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("OpenOwned(%d, %d): %v, want %v", tc.pid, tc.uid, err, tc.want)
			}
		})
	}
}

func TestPidBounds(t *testing.T) {
	// 1<<32 + 1 would be pid 1, which runs, once cut to a pid_t; 1<<31 a
	// negative pid_t, which pidfd_open refuses with EINVAL.
	for _, pid := range []int{0, -1, MaxPID + 1, 1 << 31, 1<<32 + 1} {
		if _, _, err := Open(pid, 0); !errors.Is(err, ErrGone) {
			t.Errorf("Open(%d): %v, want ErrGone", pid, err)
		}
		if _, _, err := OpenOwned(pid, 0); !errors.Is(err, ErrGone) {
			t.Errorf("OpenOwned(%d): %v, want ErrGone", pid, err)
		}
	}
}

func TestAdoptKeepsItsOwnCopy(t *testing.T) {
	cmd := startAs(t, uint32(os.Getuid()))
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	p, st, err := Adopt(f, cmd.Process.Pid)
	if err != nil || st == 0 {
		t.Fatalf("Adopt: start %d, %v", st, err)
	}
	defer p.Close()
	f.Close() // the caller's copy; the Process keeps its own
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	cmd.Process.Kill()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait on an adopted pidfd did not see the exit")
	}
}

// TestAdoptRefusesAnExitedProcess: a pidfd may outlive its process (one from
// SO_PEERPIDFD names the process that connected even after it died); binding
// to it must fail, whatever now has its pid.
func TestAdoptRefusesAnExitedProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	cmd.Wait()
	if _, _, err := Adopt(f, cmd.Process.Pid); !errors.Is(err, ErrGone) {
		t.Fatalf("Adopt of an exited process: %v, want ErrGone", err)
	}
}

// Terminate ends a process that ignores SIGTERM with SIGKILL after the grace,
// and one that heeds SIGTERM at once.
func TestTerminate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  string
		ignores bool
	}{
		{"heeds SIGTERM", "sleep 60", false},
		{"ignores SIGTERM", "trap '' TERM; while :; do sleep 0.05; done", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", tc.script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan struct{})
			go func() { cmd.Wait(); close(waited) }()
			p, _, err := Open(cmd.Process.Pid, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if tc.ignores {
				testutil.Eventually(t, "the shell to ignore SIGTERM", func() bool { return sigIgnored(t, cmd.Process.Pid, syscall.SIGTERM) })
			}
			if err := p.Terminate(100 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			<-waited
			if err := p.Signal(syscall.SIGTERM); err != nil {
				t.Fatalf("signal to an exited process: %v", err)
			}
		})
	}
}
