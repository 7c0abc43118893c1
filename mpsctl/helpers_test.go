package mpsctl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// realControl is where Debian's nvidia-cuda-mps package puts the control binary.
const realControl = "/usr/bin/nvidia-cuda-mps-control"

var (
	gpuA = "GPU-00000000-0000-0000-0000-000000000001"
	gpuB = "GPU-00000000-0000-0000-0000-000000000002"
)

// TestMain lets the test binary stand in for the control binary: the fake's
// wrapper script sets MPSCTL_FAKE and execs this binary (see fakeControl).
func TestMain(m *testing.M) {
	if mode := os.Getenv("MPSCTL_FAKE"); mode != "" {
		os.Exit(runFake(mode))
	}
	if p := os.Getenv("MPSCTL_HOLD_LOCK"); p != "" {
		os.Exit(holdLock(p))
	}
	os.Exit(m.Run())
}

// runFake is the fake control binary. It records every invocation and command in
// MPSCTL_FAKE_LOG and injects what the real binary cannot show:
//
//	hang     never answers and never exits
//	garbage  answers every command with bytes that are no answer
//	busy     answers like a daemon whose one server (pid MPSCTL_FAKE_SERVER) has two clients
//	idle     answers like a daemon whose one server (pid MPSCTL_FAKE_SERVER) has no
//	         client left: an MPS server stays up after its last client exits
//
// With arguments ("-d") it pretends to have started a daemon and exits 0.
func runFake(mode string) int {
	record := func(line string) {
		f, err := os.OpenFile(os.Getenv("MPSCTL_FAKE_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintln(f, line)
	}
	if mode == "hang" {
		record("hang")
		time.Sleep(time.Hour)
		return 0
	}
	if len(os.Args) > 1 {
		record(strings.Join(os.Args[1:], " "))
		return 0
	}
	in, _ := io.ReadAll(os.Stdin)
	for _, cmd := range strings.Split(strings.TrimSpace(string(in)), "\n") {
		record(cmd)
		switch {
		case mode == "garbage":
			fmt.Print("\x00\x7fgarbage \xff\n")
		case cmd == "get_default_active_thread_percentage":
			fmt.Println("100.0")
		case cmd == "get_server_list":
			fmt.Println(os.Getenv("MPSCTL_FAKE_SERVER"))
		case strings.HasPrefix(cmd, "get_client_list ") && mode == "idle":
			fmt.Print("")
		case strings.HasPrefix(cmd, "get_client_list "):
			fmt.Println("4242\n4343")
		}
	}
	return 0
}

// holdLock is what any user may do to a control_lock a daemon left behind
// (it is 0666): it takes a write lock on it, says "locked" and holds it until
// killed.
func holdLock(path string) int {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
	return 0
}

// startLockHolder runs holdLock on path in a child process until the test ends,
// and returns its pid once it holds the lock.
func startLockHolder(t testing.TB, path string) int {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{"MPSCTL_HOLD_LOCK=" + path, "GORACE=atexit_sleep_ms=0"}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 64)
	n, _ := io.ReadAtLeast(out, line, 1)
	if got := strings.TrimSpace(string(line[:n])); got != "locked" {
		t.Fatalf("lock holder: %q", got)
	}
	return cmd.Process.Pid
}

// fakeControl writes a wrapper script that runs this test binary as the fake
// control binary in mode; it returns the script and the fake's command log.
func fakeControl(t testing.TB, mode string, env ...string) (script, log string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log = filepath.Join(dir, "commands")
	// Under -race the binary would otherwise sleep a second at exit (GORACE's
	// atexit_sleep_ms defaults to 1000).
	env = append(env, "MPSCTL_FAKE="+mode, "MPSCTL_FAKE_LOG="+log, "GORACE=atexit_sleep_ms=0")
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for _, e := range env {
		fmt.Fprintf(&b, "export '%s'\n", e)
	}
	fmt.Fprintf(&b, "exec '%s' \"$@\"\n", exe)
	script = filepath.Join(dir, "fake-mps-control")
	if err := os.WriteFile(script, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, log
}

// fakeLog returns the lines the fake recorded.
func fakeLog(t testing.TB, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// needReal skips the test when the real control binary is not installed.
func needReal(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(realControl); err != nil {
		t.Skipf("%s is absent (Debian package nvidia-cuda-mps, from non-free): %v", realControl, err)
	}
}

// shortDir is a fresh folder with a short path, removed at the end of the test.
// t.TempDir's names grow with the test's name, and the pipe folder must stay
// within maxPipeDir bytes.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testLogger sends the package's log lines to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newReal makes Daemons on the real binary under a fresh run dir, and makes sure
// every daemon started under that run dir is gone when the test ends, even if it
// fails half-way.
// The options adjust the Config before New.
func newReal(t testing.TB, gpus []string, k int, timeout time.Duration, opts ...func(*Config)) (*Daemons, string) {
	t.Helper()
	needReal(t)
	root := shortDir(t)
	t.Cleanup(func() { killDaemons(t, root) })
	return newAt(t, root, gpus, k, timeout, opts...), root
}

// newAt makes Daemons on the real binary under root; Close runs at cleanup.
func newAt(t testing.TB, root string, gpus []string, k int, timeout time.Duration, opts ...func(*Config)) *Daemons {
	t.Helper()
	cfg := Config{
		Control:         realControl,
		RunDir:          root,
		InstancesPerGPU: k,
		Timeout:         timeout,
		MinBackoff:      time.Millisecond,
		MaxBackoff:      50 * time.Millisecond,
		Logger:          testLogger(t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := New(cfg, gpus)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// daemonsUnder returns the sorted pids of live control daemons ("-d") whose pipe
// folder lies under root, found in /proc independently of the package.
func daemonsUnder(t testing.TB, root string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !slices.Contains(args[1:], "-d") {
			continue
		}
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, v := range bytes.Split(environ, []byte{0}) {
			if dir, ok := strings.CutPrefix(string(v), "CUDA_MPS_PIPE_DIRECTORY="); ok && strings.HasPrefix(dir, root+"/") {
				pids = append(pids, pid)
			}
		}
	}
	slices.Sort(pids)
	return pids
}

// killDaemons SIGKILLs every daemon under root (a SIGSTOPped one too).
func killDaemons(t testing.TB, root string) {
	for _, pid := range daemonsUnder(t, root) {
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(context.Background(), pid, 5*time.Second)
	}
}

// answers asks the daemon of pipeDir the harmless question with the real front
// end, bypassing the package.
func answers(t testing.TB, pipeDir string) bool {
	t.Helper()
	cmd := exec.Command(realControl)
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipeDir, "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(filepath.Dir(pipeDir), "log")}
	cmd.Stdin = strings.NewReader("get_default_active_thread_percentage\n")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	return err == nil && strings.TrimSpace(string(out)) == "100.0"
}

// statusPIDs returns the control daemon pids the Daemons reports, sorted, and
// fails the test unless every instance is running.
func statusPIDs(t testing.TB, d *Daemons, gpus []string) []int {
	t.Helper()
	var pids []int
	for _, g := range gpus {
		for _, s := range d.Status(g) {
			if s.State != api.InstanceRunning || s.PID == 0 {
				t.Fatalf("%s/%d: state %s pid %d err %v, want running with a pid", g, s.Instance, s.State, s.PID, s.Err)
			}
			pids = append(pids, s.PID)
		}
	}
	slices.Sort(pids)
	return pids
}

// checkUntil runs Check until instance k of gpu is in state want, for at most
// within.
func checkUntil(t testing.TB, d *Daemons, gpu string, k int, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		d.Check(context.Background())
		s := d.Status(gpu)[k]
		if s.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%d is %s (err %v) after %v, want %s", gpu, k, s.State, s.Err, within, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeClock is a settable clock for the backoff.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
