package procwatch

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
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
	select {
	case err := <-done:
		t.Fatalf("Wait returned before exit: %v", err)
	case <-time.After(50 * time.Millisecond):
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
	time.Sleep(10 * time.Millisecond)
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

// Terminate ends a process that ignores SIGTERM with SIGKILL after the grace,
// and one that heeds SIGTERM at once.
func TestTerminate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
	}{
		{"heeds SIGTERM", "sleep 60"},
		{"ignores SIGTERM", "trap '' TERM; while :; do sleep 0.05; done"},
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
			// Let the shell install its trap.
			time.Sleep(50 * time.Millisecond)
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
