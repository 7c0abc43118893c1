package mpsctl

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// TestOpen: --mps=auto falls back to a null manager on every MPS problem, --mps=on
// stops with an error naming it, and a working binary is on in both modes.
func TestOpen(t *testing.T) {
	t.Parallel()
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Fatal(err)
	}
	hang, _ := fakeControl(t, "hang")
	garbage, _ := fakeControl(t, "garbage")
	tooLong := "/" + strings.Repeat("r", 40)
	tests := []struct {
		name    string
		control string
		runDir  string // "" for a fresh short folder
		real    bool
		onErr   string // what the error of --mps=on says; "" when on works
	}{
		{name: "pipe folder too long", control: realControl, runDir: tooLong, onErr: "at most 87"},
		{name: "binary exits at once", control: falseBin, onErr: "no MPS control daemon started"},
		{name: "binary hangs", control: hang, onErr: "timed out"},
		{name: "binary answers garbage", control: garbage, onErr: "unexpected output"},
		{name: "works", control: realControl, real: true},
	}
	for _, tt := range tests {
		for _, mode := range []Mode{ModeAuto, ModeOn} {
			t.Run(tt.name+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				if tt.real {
					needReal(t)
				}
				root := tt.runDir
				if root == "" {
					root = shortDir(t)
					t.Cleanup(func() { killDaemons(t, root) })
				}
				// Short only where the binary hangs: a loaded machine may take a
				// while to start a real daemon.
				timeout := 5 * time.Second
				if tt.control == hang {
					timeout = 300 * time.Millisecond
				}
				cfg := Config{Control: tt.control, RunDir: root, InstancesPerGPU: 2, Timeout: timeout, Logger: testLogger(t)}
				d, err := Open(context.Background(), mode, cfg, []string{gpuA, gpuB})
				if d != nil {
					t.Cleanup(func() { d.Close() })
				}
				if mode == ModeOn && tt.onErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.onErr) || !strings.Contains(err.Error(), "--mps=on") {
						t.Fatalf("Open = %v, want an error about --mps=on mentioning %q", err, tt.onErr)
					}
					if d != nil {
						t.Fatal("Open returned Daemons with its error")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				wantOn := tt.onErr == ""
				if d.On() != wantOn {
					t.Fatalf("On() = %v, want %v", d.On(), wantOn)
				}
				want := api.InstanceOff
				if wantOn {
					want = api.InstanceRunning
				}
				for _, g := range []string{gpuA, gpuB} {
					for _, s := range d.Status(g) {
						if s.State != want {
							t.Fatalf("%s/%d is %s, want %s", g, s.Instance, s.State, want)
						}
					}
				}
				if !wantOn && d.Env(gpuA, 0) != nil {
					t.Fatalf("Env = %v with MPS off", d.Env(gpuA, 0))
				}
				if tt.runDir == "" {
					if n := len(daemonsUnder(t, root)); wantOn != (n == 4) || !wantOn && n != 0 {
						t.Fatalf("%d control daemons run under the run dir", n)
					}
				}
			})
		}
	}
}

// TestOpenCanceled: a Start cut short by the caller's context is no reason to
// turn MPS off or to fail; the caller is stopping.
func TestOpenCanceled(t *testing.T) {
	t.Parallel()
	hang, _ := fakeControl(t, "hang")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, mode := range []Mode{ModeAuto, ModeOn} {
		d, err := Open(ctx, mode, Config{Control: hang, RunDir: shortDir(t), InstancesPerGPU: 1, Timeout: 200 * time.Millisecond, Logger: testLogger(t)}, []string{gpuA})
		if err != nil || !d.On() {
			t.Fatalf("--mps=%s: Open = %v, on %v; want the Daemons as they are", mode, err, d != nil && d.On())
		}
		d.Close()
	}
}

// TestOpenOffReportsConfigErrors: with MPS off only what is wrong whatever the
// mode is an error, without a --mps prefix.
func TestOpenOffReportsConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), ModeOff, Config{}, []string{gpuA})
	if err == nil || strings.Contains(err.Error(), "--mps") || !strings.Contains(err.Error(), "instances per GPU") {
		t.Fatalf("Open = %v", err)
	}
}
