// Package e2e is the harness of gpulet's end-to-end tests and benchmarks: it
// builds the real binaries once, starts gpuletd on the simulated backend in a
// temporary folder, and talks to it over its socket like users do.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
)

// binDir holds the binaries built for this run.
var binDir string

// Binaries are the commands Main builds: name and package, relative to the
// module root. gpurun and gpulet-collector are built without cgo, as users
// get them.
var Binaries = []struct{ Name, Pkg string }{
	{"gpuletd", "./cmd/gpuletd"},
	{"gpurun", "./cmd/gpurun"},
	{"gpulet", "./cmd/gpulet"},
	{"gpulet-collector", "./cmd/gpulet-collector"},
	{"gpulet-replay", "./cmd/gpulet-replay"},
}

// Main builds the binaries into a temporary folder, runs the tests and cleans
// up. Call it from TestMain.
func Main(m *testing.M) int {
	cleanup, err := Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	return m.Run()
}

// Build builds the binaries into a temporary folder, which cleanup
// removes. Main calls it; a TestMain that needs the binaries before its
// tests run (to put them in a container image) calls it itself.
func Build() (cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "gpulet-e2e-bin-")
	if err != nil {
		return nil, err
	}
	binDir = dir
	if err := build(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return func() { os.RemoveAll(dir) }, nil
}

// ModuleRoot is the folder of the module's go.mod.
func ModuleRoot() string { return moduleRoot() }

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BuildTags are the build tags of the binaries, as the Makefile's BUILD_TAGS
// (a test holds the two alike), so that tests run what `make` builds.
const BuildTags = "grpcnotrace"

func build() error {
	for _, b := range Binaries {
		// -buildvcs=auto as the Makefile, so that --version names the commit.
		cmd := exec.Command("go", "build", "-tags", BuildTags, "-buildvcs=auto", "-o", filepath.Join(binDir, b.Name), b.Pkg)
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		if b.Name != "gpuletd" {
			cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", b.Name, err, out)
		}
	}
	return nil
}

// Bin is the path of a built binary.
func Bin(name string) string { return filepath.Join(binDir, name) }

// Daemon is one running gpuletd.
type Daemon struct {
	t      testing.TB
	Dir    string
	Socket string
	RunDir string
	Args   []string
	Client *client.Client
	Log    *testutil.SyncBuffer
	// Binary is the gpuletd that runs: the one this harness built, unless
	// StartBinary named another (an older build, to compare against).
	Binary string

	cmd  *exec.Cmd
	done chan error
}

// Start starts gpuletd in a fresh folder with extra flags (which override the
// defaults given here) and waits until it answers.
func Start(t testing.TB, extra ...string) *Daemon {
	t.Helper()
	return StartBinary(t, Bin("gpuletd"), extra...)
}

// StartBinary is Start with another gpuletd binary.
func StartBinary(t testing.TB, binary string, extra ...string) *Daemon {
	t.Helper()
	dir := t.TempDir()
	d := &Daemon{t: t, Dir: dir, Socket: filepath.Join(dir, "gpulet.sock"), RunDir: filepath.Join(dir, "run"), Binary: binary}
	d.Args = append([]string{
		"--socket", d.Socket, "--run-dir", d.RunDir, "--state-dir", filepath.Join(dir, "state"),
		"--mount", "", "--backend", "sim", "--node-name", "e2e", "--sample-interval", "100ms", "--mps", "off",
	}, append(selfAdmin(), extra...)...)
	d.Client = &client.Client{Socket: d.Socket}
	d.Restart()
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("gpuletd log:\n%s", d.Log.String())
		}
	})
	return d
}

// Restart starts the daemon again with the same flags and waits until it
// answers.
func (d *Daemon) Restart() {
	d.t.Helper()
	d.Log = &testutil.SyncBuffer{}
	d.cmd = exec.Command(d.Binary, d.Args...)
	d.cmd.Stdout, d.cmd.Stderr = d.Log, d.Log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(d.cmd, d.done)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.Client.Snapshot(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-d.done:
			d.t.Fatalf("gpuletd exited during start: %v\n%s", err, d.Log.String())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("gpuletd did not answer within 20s: %v\n%s", err, d.Log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop sends SIGTERM and returns the exit error.
func (d *Daemon) Stop() error {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return nil
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		return err
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		return errors.New("gpuletd did not stop within 20s of SIGTERM")
	}
}

// Kill9 kills gpuletd the hard way.
func (d *Daemon) Kill9() {
	d.cmd.Process.Kill()
	<-d.done
}

// Pid is the daemon's pid.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// HTTP is a plain HTTP client on the daemon's socket.
func (d *Daemon) HTTP() *http.Client {
	return &http.Client{Transport: testutil.UnixTransport(d.Socket)}
}

// Output runs cmd and returns its combined output and exit status; only a
// command that could not run at all fails the test.
func Output(t testing.TB, cmd *exec.Cmd) (string, int) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// Ctx is a context that ends with the test, or after 30 seconds.
func Ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// CountFIFOs counts the unit FIFOs of a GPU in the ledger under runDir.
func CountFIFOs(t testing.TB, runDir, uuid string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(filepath.Join(runDir, "units", uuid), func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type()&os.ModeNamedPipe != 0 && strings.HasPrefix(e.Name(), "unit-") {
			n++
		}
		return nil
	})
	return n
}

// selfAdmin is, for a test run as a plain user, the flag that makes its own
// group gpuletd's admin group: the test then acts on the daemon as root
// does (drain, every pool, every lease). Root needs none. The simulated GPU
// controls stay root's (RequireRoot).
func selfAdmin() []string {
	if os.Getuid() == 0 {
		return nil
	}
	g, err := user.LookupGroupId(strconv.Itoa(os.Getgid()))
	if err != nil {
		return nil
	}
	return []string{"--admin-group", g.Name}
}

// RequireRoot skips a test that needs root, saying what for.
func RequireRoot(tb testing.TB, what string) {
	tb.Helper()
	if os.Getuid() != 0 {
		tb.Skipf("needs root: %s; runs as uid %d", what, os.Getuid())
	}
}

// RequireFUSE skips tb, saying why, where no real FUSE mount can be made: no
// /dev/fuse, or neither root nor fusermount3 (make test installs fuse3 as
// root).
func RequireFUSE(tb testing.TB) {
	tb.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		tb.Skip("no /dev/fuse on this machine:", err)
	}
	if os.Getuid() != 0 {
		if _, err := os.Stat("/usr/bin/fusermount3"); err != nil {
			tb.Skip("not root and no fusermount3 (make test installs fuse3 as root)")
		}
		// fusermount3 opens /dev/fuse as the user: a device only root may
		// open (as in some containers) mounts nothing.
		f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			tb.Skip("not root and /dev/fuse cannot be opened:", err)
		}
		f.Close()
	}
}
