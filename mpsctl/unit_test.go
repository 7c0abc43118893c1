package mpsctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	_, realErr := os.Stat(realControl)
	tests := []struct {
		name        string
		mode        Mode
		control     string
		needReal    bool
		wantPath    string
		wantEnabled bool
		wantErr     error
		errHas      []string
	}{
		{name: "off never looks", mode: "off", control: missing},
		{name: "on by name", mode: "on", control: "nvidia-cuda-mps-control", needReal: true, wantPath: realControl, wantEnabled: true},
		{name: "auto by path", mode: "auto", control: realControl, needReal: true, wantPath: realControl, wantEnabled: true},
		{name: "auto missing", mode: "auto", control: missing},
		{name: "on missing", mode: "on", control: missing, wantErr: ErrNotFound, errHas: []string{"nvidia-cuda-mps", missing}},
		{name: "on empty", mode: "on", control: "", wantErr: ErrNotFound},
		{name: "bad mode", mode: "yes", control: realControl, wantErr: ErrBadMode, errHas: []string{`"yes"`, "on", "off", "auto"}},
		{name: "empty mode", mode: "", control: realControl, wantErr: ErrBadMode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needReal && realErr != nil {
				t.Skipf("%s is absent: %v", realControl, realErr)
			}
			path, enabled, err := Resolve(tt.mode, tt.control)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			for _, s := range tt.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if path != tt.wantPath || enabled != tt.wantEnabled {
				t.Fatalf("Resolve = %q, %v; want %q, %v", path, enabled, tt.wantPath, tt.wantEnabled)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		if got, err := ParseMode(string(m)); got != m || err != nil {
			t.Errorf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	for _, bad := range []string{"", "yes", "ON", " on", "auto "} {
		got, err := ParseMode(bad)
		if !errors.Is(err, ErrBadMode) || got != "" {
			t.Errorf("ParseMode(%q) = %q, %v; want ErrBadMode", bad, got, err)
			continue
		}
		for _, s := range []string{"--mps", fmt.Sprintf("%q", bad), "on", "off", "auto"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("ParseMode(%q): error %q does not mention %s", bad, err, s)
			}
		}
	}
}

func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"on", "off", "auto", "", "On", "auto\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMode(s)
		if (err == nil) != slices.Contains(modes, Mode(s)) || (err == nil && string(m) != s) {
			t.Fatalf("ParseMode(%q) = %q, %v", s, m, err)
		}
	})
}

func TestParseProbe(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		out     string
		servers []int
		wantErr bool
	}{
		{name: "no server", out: "100.0\n"},
		{name: "servers", out: "100.0\n4169\n4200\n", servers: []int{4169, 4200}},
		{name: "partial percentage", out: "37.5\n"},
		{name: "empty", out: "", wantErr: true},
		{name: "unknown command", out: "Unknown command \"get_default_active_thread_percentage\"\n", wantErr: true},
		{name: "zero percent", out: "0\n", wantErr: true},
		{name: "over 100", out: "150.0\n", wantErr: true},
		{name: "garbage pid", out: "100.0\nServer not found\n", wantErr: true},
		{name: "negative pid", out: "100.0\n-3\n", wantErr: true},
		{name: "binary", out: "\x00\x7fgarbage \xff\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			servers, err := parseProbe(tt.out)
			if tt.wantErr {
				if !errors.Is(err, ErrBadOutput) {
					t.Fatalf("err = %v, want ErrBadOutput", err)
				}
				return
			}
			if err != nil || len(servers) != len(tt.servers) {
				t.Fatalf("parseProbe = %v, %v; want %v", servers, err, tt.servers)
			}
			for i := range servers {
				if servers[i] != tt.servers[i] {
					t.Fatalf("servers = %v, want %v", servers, tt.servers)
				}
			}
		})
	}
}

func TestParseClients(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		out     string
		want    int
		wantErr bool
	}{
		{name: "none", out: ""},
		{name: "two", out: "4242\n4343\n", want: 2},
		{name: "server gone", out: "Server 77 not found\n"},
		{name: "other server gone", out: "Server 78 not found\n", wantErr: true},
		{name: "garbage", out: "hello\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pids, err := parseClients(tt.out, 77)
			if n := len(pids); tt.wantErr != (err != nil) || n != tt.want {
				t.Fatalf("parseClients = %v, %v; want %d pids, error %v", pids, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrBadOutput) {
				t.Fatalf("err = %v, want ErrBadOutput", err)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	lo, hi := 500*time.Millisecond, 5*time.Second
	want := []time.Duration{lo, time.Second, 2 * time.Second, 4 * time.Second, hi, hi}
	for n, w := range want {
		if got := backoff(lo, hi, n); got != w {
			t.Errorf("backoff(%d) = %v, want %v", n, got, w)
		}
	}
	if got := backoff(lo, hi, 1000); got != hi {
		t.Errorf("backoff(1000) = %v, want %v", got, hi)
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	long := "/" + strings.Repeat("r", 40)
	tests := []struct {
		name string
		cfg  Config
		gpus []string
		has  string
	}{
		{name: "no instances", cfg: Config{Control: realControl, RunDir: "/run/gpulet"}, gpus: []string{gpuA}, has: "instances per GPU"},
		{name: "relative run dir", cfg: Config{Control: realControl, RunDir: "run", InstancesPerGPU: 1}, gpus: []string{gpuA}, has: "not absolute"},
		{name: "uuid with slash", cfg: Config{Control: realControl, RunDir: "/run/gpulet", InstancesPerGPU: 1}, gpus: []string{"MIG-GPU-1/0/0"}, has: "cannot name a folder"},
		{name: "uuid dot dot", cfg: Config{Control: realControl, RunDir: "/run/gpulet", InstancesPerGPU: 1}, gpus: []string{".."}, has: "cannot name a folder"},
		{name: "empty uuid", cfg: Config{Control: realControl, RunDir: "/run/gpulet", InstancesPerGPU: 1}, gpus: []string{""}, has: "cannot name a folder"},
		{name: "duplicate", cfg: Config{Control: realControl, RunDir: "/run/gpulet", InstancesPerGPU: 1}, gpus: []string{gpuA, gpuA}, has: "twice"},
		{name: "pipe path too long", cfg: Config{Control: realControl, RunDir: long, InstancesPerGPU: 1}, gpus: []string{gpuA}, has: "at most 87"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, tt.gpus)
			if err == nil || !strings.Contains(err.Error(), tt.has) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tt.has)
			}
		})
	}
	// The default run dir fits with room to spare, k of two digits included.
	if _, err := New(Config{Control: realControl, RunDir: "/run/gpulet", InstancesPerGPU: 16}, []string{gpuA}); err != nil {
		t.Fatal(err)
	}
}

// TestOff: with MPS off the Daemons is a null manager.
func TestOff(t *testing.T) {
	t.Parallel()
	d, err := New(Config{InstancesPerGPU: 2, RunDir: "relative is fine when off"}, []string{gpuA, gpuB})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.Check(context.Background())
	st := d.Status(gpuB)
	if len(st) != 2 || st[0].State != api.InstanceOff || st[1].State != api.InstanceOff {
		t.Fatalf("Status = %+v, want two instances off", st)
	}
	if d.PipeDir(gpuA, 0) != "" || d.LogDir(gpuA, 0) != "" || d.Env(gpuA, 0) != nil {
		t.Fatal("paths or env with MPS off")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPathsOnlyForKnownInstances(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Control: realControl, RunDir: "/run/gpulet/", InstancesPerGPU: 2}, []string{gpuA})
	if err != nil {
		t.Fatal(err)
	}
	env := d.Env(gpuA, 1)
	if env["CUDA_MPS_PIPE_DIRECTORY"] != "/run/gpulet/mps/"+gpuA+"/1/pipe" || env["CUDA_MPS_LOG_DIRECTORY"] != "/run/gpulet/mps/"+gpuA+"/1/log" || len(env) != 2 {
		t.Fatalf("Env = %v", env)
	}
	for _, c := range []struct {
		gpu string
		k   int
	}{{gpuB, 0}, {gpuA, 2}, {gpuA, -1}, {"../etc", 0}} {
		if d.PipeDir(c.gpu, c.k) != "" || d.LogDir(c.gpu, c.k) != "" || d.Env(c.gpu, c.k) != nil || (c.k == 0 && d.Status(c.gpu) != nil) {
			t.Errorf("%s/%d: got paths for an unknown instance", c.gpu, c.k)
		}
	}
}

// TestCleanStale removes only the daemon's known names, a symlink itself and not
// its target, and never a folder.
func TestCleanStale(t *testing.T) {
	t.Parallel()
	pipe := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(target, []byte("keep"), 0o644))
	must(os.Symlink(target, filepath.Join(pipe, "control")))
	must(os.WriteFile(filepath.Join(pipe, "control_lock"), nil, 0o666))
	must(syscall.Mkfifo(filepath.Join(pipe, "log"), 0o777))
	must(os.Mkdir(filepath.Join(pipe, "control_privileged"), 0o755))
	must(os.WriteFile(filepath.Join(pipe, "other"), nil, 0o644))

	if err := cleanStale(pipe); err == nil || !strings.Contains(err.Error(), "is a folder") {
		t.Fatalf("cleanStale = %v, want an error about the folder", err)
	}
	for _, gone := range []string{"control", "control_lock", "log"} {
		if _, err := os.Lstat(filepath.Join(pipe, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", gone, err)
		}
	}
	for _, kept := range []string{"control_privileged", "other"} {
		if _, err := os.Lstat(filepath.Join(pipe, kept)); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Fatalf("symlink target: %q %v", b, err)
	}
}

// TestStartRefusesSymlinkedFolder: a symlink under the run dir is never
// followed, so nothing is created or started where it points.
func TestStartRefusesSymlinkedFolder(t *testing.T) {
	t.Parallel()
	control, log := fakeControl(t, "garbage")
	root := shortDir(t)
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "mps")); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Control: control, RunDir: root, InstancesPerGPU: 1, Logger: testLogger(t)}, []string{gpuA})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Fatalf("Start = %v, want an error about the symlink", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Fatalf("created %v through the symlink", ents)
	}
	for _, c := range fakeLog(t, log) {
		if c == "-d" {
			t.Fatal("a daemon was started")
		}
	}
}

func TestLockHolderWithoutDaemon(t *testing.T) {
	t.Parallel()
	pipe := t.TempDir()
	if pid, err := lockHolder(pipe); pid != 0 || err != nil {
		t.Fatalf("no file: %d, %v", pid, err)
	}
	if err := os.WriteFile(filepath.Join(pipe, lockFile), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if pid, err := lockHolder(pipe); pid != 0 || err != nil {
		t.Fatalf("unlocked file: %d, %v", pid, err)
	}
}

// A bad --mps value reads as the other flags' errors do, without the
// package's name.
func TestParseModeMessage(t *testing.T) {
	_, err := ParseMode("yes")
	if want := `--mps "yes": want on, off or auto`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}
