// Package test runs gpulet's real binaries end to end: it builds them once,
// starts gpuletd on the simulated backend in a temporary folder, and talks to
// it over its socket like users and schedulers do.
package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/client"
)

// binDir holds the binaries built for this run.
var binDir string

func TestMain(m *testing.M) {
	if role := os.Getenv(helperRoleEnv); role != "" {
		os.Exit(runHelperRole(role))
	}
	dir, err := os.MkdirTemp("", "gpulet-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := build()
	if code == 0 {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func build() int {
	for _, b := range []struct{ name, pkg string }{{"gpuletd", "./cmd/gpuletd"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.name), b.pkg)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", b.name, err, out)
			return 1
		}
	}
	return 0
}

func bin(name string) string { return filepath.Join(binDir, name) }

// daemon is one running gpuletd.
type daemon struct {
	t      *testing.T
	dir    string
	socket string
	runDir string
	args   []string
	cmd    *exec.Cmd
	log    *syncBuffer
	done   chan error
	client *client.Client
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDaemon starts gpuletd in a fresh folder with extra flags and waits until
// it answers.
func startDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	d := &daemon{t: t, dir: dir, socket: filepath.Join(dir, "gpulet.sock"), runDir: filepath.Join(dir, "run")}
	d.args = append([]string{
		"--socket", d.socket, "--run-dir", d.runDir, "--state-dir", filepath.Join(dir, "state"),
		"--mount", "", "--backend", "sim", "--node-name", "e2e", "--sample-interval", "100ms",
	}, extra...)
	d.client = &client.Client{Socket: d.socket}
	d.start()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("gpuletd log:\n%s", d.log.String())
		}
	})
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	d.log = &syncBuffer{}
	d.cmd = exec.Command(bin("gpuletd"), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(d.cmd, d.done)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.client.Snapshot(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-d.done:
			d.t.Fatalf("gpuletd exited during start: %v\n%s", err, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("gpuletd did not answer within 20s: %v\n%s", err, d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and returns the exit error.
func (d *daemon) stop() error {
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

// kill9 kills gpuletd the hard way.
func (d *daemon) kill9() {
	d.cmd.Process.Kill()
	<-d.done
}

func (d *daemon) restart() {
	d.t.Helper()
	d.start()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond until it holds or 10 seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countFIFOs counts unit FIFOs of a GPU in the ledger.
func countFIFOs(t *testing.T, runDir, uuid string) int {
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
