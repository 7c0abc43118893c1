package mpsctl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// TestRealLifecycle runs two instances for each of two GPUs on the real binary:
// start, a daemon killed with SIGKILL marked down and restarted by Check while
// Status is read concurrently, and Close quitting them all.
func TestRealLifecycle(t *testing.T) {
	t.Parallel()
	gpus := []string{gpuA, gpuB}
	d, root := newReal(t, gpus, 2, 2*time.Second)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pids := statusPIDs(t, d, gpus)
	if got := daemonsUnder(t, root); !slices.Equal(got, pids) {
		t.Fatalf("daemons in /proc %v, Status says %v", got, pids)
	}
	for _, g := range gpus {
		for k := range 2 {
			pipe := d.PipeDir(g, k)
			if want := filepath.Join(root, "mps", g, string(rune('0'+k)), "pipe"); pipe != want {
				t.Fatalf("PipeDir = %s, want %s", pipe, want)
			}
			if !answers(t, pipe) {
				t.Fatalf("%s/%d does not answer on %s", g, k, pipe)
			}
			fi, err := os.Stat(pipe)
			if err != nil || fi.Mode().Perm() != 0o755 {
				t.Fatalf("pipe folder %s: %v %v, want mode 0755", pipe, fi.Mode(), err)
			}
			if _, err := os.Stat(filepath.Join(d.LogDir(g, k), "control.log")); err != nil {
				t.Fatal(err)
			}
			if s := d.Status(g)[k]; s.ServerUID != nil || s.Clients != 0 {
				t.Fatalf("%s/%d: server uid %v clients %d without a GPU", g, k, s.ServerUID, s.Clients)
			}
		}
	}

	// Readers poll Status and the paths while Check restarts a daemon, as the
	// agent's snapshot builder does.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, g := range gpus {
				_ = d.Status(g)
				_ = d.Env(g, 1)
			}
			time.Sleep(time.Millisecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()

	victim := d.Status(gpuB)[1].PID
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitGone(context.Background(), victim, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	d.Check(context.Background())
	s := d.Status(gpuB)[1]
	if s.State != api.InstanceDown || !errors.Is(s.Err, ErrNoDaemon) {
		t.Fatalf("killed instance: state %s err %v, want down with ErrNoDaemon", s.State, s.Err)
	}
	for _, other := range []InstanceStatus{d.Status(gpuA)[0], d.Status(gpuA)[1], d.Status(gpuB)[0]} {
		if other.State != api.InstanceRunning {
			t.Fatalf("instance %d of a GPU is %s after another died", other.Instance, other.State)
		}
	}
	checkUntil(t, d, gpuB, 1, api.InstanceRunning, 5*time.Second)
	t.Logf("death to running again: %v (backoff %v)", time.Since(died), d.cfg.MinBackoff)
	if now := d.Status(gpuB)[1].PID; now == victim || !answers(t, d.PipeDir(gpuB, 1)) {
		t.Fatalf("restarted instance: pid %d (killed %d), or it does not answer", now, victim)
	}
	pids = statusPIDs(t, d, gpus)
	if got := daemonsUnder(t, root); !slices.Equal(got, pids) || len(got) != 4 {
		t.Fatalf("after restart: daemons in /proc %v, Status says %v", got, pids)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := daemonsUnder(t, root); len(got) != 0 {
		t.Fatalf("daemons left after Close: %v", got)
	}
	for _, g := range gpus {
		for _, s := range d.Status(g) {
			if s.State != api.InstanceDown {
				t.Fatalf("%s/%d is %s after Close", g, s.Instance, s.State)
			}
		}
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := d.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
}

// TestRealAdopt: a second Daemons on the same run dir (gpuletd restarted) adopts
// the live daemons and starts no duplicate.
func TestRealAdopt(t *testing.T) {
	t.Parallel()
	gpus := []string{gpuA, gpuB}
	first, root := newReal(t, gpus, 1, 2*time.Second)
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := daemonsUnder(t, root)
	if len(before) != 2 {
		t.Fatalf("daemons after first Start: %v, want 2", before)
	}

	second := newAt(t, root, gpus, 1, 2*time.Second)
	if err := second.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := statusPIDs(t, second, gpus); !slices.Equal(got, before) {
		t.Fatalf("second Daemons reports pids %v, want the adopted %v", got, before)
	}
	if got := daemonsUnder(t, root); !slices.Equal(got, before) {
		t.Fatalf("daemons after second Start: %v, want the same %v", got, before)
	}
	for _, g := range gpus {
		log, err := os.ReadFile(filepath.Join(second.LogDir(g, 0), "control.log"))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(log), "Starting control daemon"); n != 1 {
			t.Fatalf("%s: control.log shows %d daemon starts, want 1", g, n)
		}
	}

	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if got := daemonsUnder(t, root); len(got) != 0 {
		t.Fatalf("daemons left after Close: %v", got)
	}
	// The first one finds nothing left to quit.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRealHung: a daemon that stops answering (SIGSTOP) is marked down when the
// probe times out, then killed and replaced.
func TestRealHung(t *testing.T) {
	t.Parallel()
	d, root := newReal(t, []string{gpuA}, 1, 300*time.Millisecond)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	victim := d.Status(gpuA)[0].PID
	if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d.Check(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Check took %v with a hung daemon and a 300ms timeout", took)
	}
	if s := d.Status(gpuA)[0]; s.State != api.InstanceDown || !errors.Is(s.Err, ErrTimeout) {
		t.Fatalf("hung instance: state %s err %v, want down with ErrTimeout", s.State, s.Err)
	}
	checkUntil(t, d, gpuA, 0, api.InstanceRunning, 5*time.Second)
	if alive(victim) {
		t.Fatalf("hung daemon %d still runs", victim)
	}
	pids := statusPIDs(t, d, []string{gpuA})
	if got := daemonsUnder(t, root); !slices.Equal(got, pids) || pids[0] == victim {
		t.Fatalf("daemons %v, Status %v, hung one was %d", got, pids, victim)
	}
}

// TestRealCloseAfterFailedStart: Close after a Start that failed (canceled
// context) returns, leaves nothing running, and may be repeated.
func TestRealCloseAfterFailedStart(t *testing.T) {
	t.Parallel()
	d, root := newReal(t, []string{gpuA}, 2, 2*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a canceled context = %v, want context.Canceled", err)
	}
	for _, s := range d.Status(gpuA) {
		if s.State != api.InstanceDown {
			t.Fatalf("instance %d is %s after a failed Start", s.Instance, s.State)
		}
	}
	for range 2 {
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := daemonsUnder(t, root); len(got) != 0 {
		t.Fatalf("daemons left: %v", got)
	}
}

// TestRealStaleFiles: files a killed daemon left (and a planted symlink among
// them) do not stop a new daemon, and the symlink's target survives.
func TestRealStaleFiles(t *testing.T) {
	t.Parallel()
	d, _ := newReal(t, []string{gpuA}, 1, 2*time.Second)
	pipe := d.PipeDir(gpuA, 0)
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(pipe, "control_lock")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(pipe, "log"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !answers(t, pipe) {
		t.Fatal("daemon does not answer")
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Fatalf("symlink target: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(pipe, "control_lock")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("control_lock: %v %v, want the daemon's own file", fi, err)
	}
}

// TestRealForeignLockOnStaleFiles: a daemon that quit leaves its 0666
// control_lock behind, and any user may lock it. Such a lock holder is not a
// daemon, and must not keep the instance from starting: the stale file is
// removed and the new daemon makes its own.
func TestRealForeignLockOnStaleFiles(t *testing.T) {
	t.Parallel()
	first, root := newReal(t, []string{gpuA}, 1, 2*time.Second)
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(first.PipeDir(gpuA, 0), lockFile)
	holder := startLockHolder(t, lock)
	if pid, err := lockHolder(first.PipeDir(gpuA, 0)); pid != holder || err != nil {
		t.Fatalf("lockHolder = %d, %v; want the holder %d", pid, err, holder)
	}

	second := newAt(t, root, []string{gpuA}, 1, 2*time.Second)
	if err := second.Start(context.Background()); err != nil {
		t.Fatalf("Start beside a foreign lock on a stale control_lock: %v", err)
	}
	if !answers(t, second.PipeDir(gpuA, 0)) {
		t.Fatal("daemon does not answer")
	}
	if !alive(holder) {
		t.Fatal("the lock holder, not a daemon of ours, was killed")
	}
}
