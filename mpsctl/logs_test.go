package mpsctl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// logLines is n numbered lines of the control daemon's shape, each 64 bytes.
func logLines(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "[2026-01-01 00:00:00.000 Control 1] Cmd:get_server_list %09d\n", i)
	}
	return b.Bytes()
}

func TestTrimLog(t *testing.T) {
	t.Parallel()
	const bound = 64 << 10
	big := logLines(2 * bound / 64) // twice the bound
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		// setup prepares dir/control.log and returns a file whose content must
		// stay "keep" (a symlink's or hard link's target), or "".
		setup   func(t *testing.T, dir string) string
		trimmed bool
		errHas  string
	}{
		{name: "absent", setup: func(t *testing.T, dir string) string { return "" }},
		{name: "within the bound", setup: func(t *testing.T, dir string) string {
			must(t, os.WriteFile(filepath.Join(dir, "control.log"), big[:bound], 0o644))
			return ""
		}},
		{name: "too long", trimmed: true, setup: func(t *testing.T, dir string) string {
			must(t, os.WriteFile(filepath.Join(dir, "control.log"), big, 0o644))
			return ""
		}},
		{name: "symlink", setup: func(t *testing.T, dir string) string {
			target := filepath.Join(t.TempDir(), "target")
			must(t, os.WriteFile(target, append([]byte("keep"), big...), 0o644))
			must(t, os.Symlink(target, filepath.Join(dir, "control.log")))
			return target
		}},
		{name: "hard link", setup: func(t *testing.T, dir string) string {
			target := filepath.Join(dir, "other")
			must(t, os.WriteFile(target, append([]byte("keep"), big...), 0o644))
			must(t, os.Link(target, filepath.Join(dir, "control.log")))
			return target
		}},
		{name: "fifo", setup: func(t *testing.T, dir string) string {
			must(t, syscall.Mkfifo(filepath.Join(dir, "control.log"), 0o666))
			return ""
		}},
		{name: "planted .1 symlink is replaced", trimmed: true, setup: func(t *testing.T, dir string) string {
			must(t, os.WriteFile(filepath.Join(dir, "control.log"), big, 0o644))
			target := filepath.Join(t.TempDir(), "target")
			must(t, os.WriteFile(target, []byte("keep"), 0o644))
			must(t, os.Symlink(target, filepath.Join(dir, "control.log.1")))
			return target
		}},
		{name: ".1 a folder: cut all the same", trimmed: true, errHas: "control.log.1", setup: func(t *testing.T, dir string) string {
			must(t, os.WriteFile(filepath.Join(dir, "control.log"), big, 0o644))
			must(t, os.Mkdir(filepath.Join(dir, "control.log.1"), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "control.log.1", "x"), nil, 0o644))
			return ""
		}},
	}
	if os.Geteuid() == 0 {
		tests = append(tests, struct {
			name    string
			setup   func(t *testing.T, dir string) string
			trimmed bool
			errHas  string
		}{name: "another user's file", setup: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "control.log")
			must(t, os.WriteFile(p, append([]byte("keep"), big...), 0o644))
			must(t, os.Chown(p, 65534, 65534))
			return p
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			keep := tt.setup(t, dir)
			size, err := trimLog(dir, "control.log", bound)
			if tt.errHas == "" && err != nil || tt.errHas != "" && (err == nil || !strings.Contains(err.Error(), tt.errHas)) {
				t.Fatalf("trimLog = %v, want error %q", err, tt.errHas)
			}
			if (size > 0) != tt.trimmed {
				t.Fatalf("trimLog cut a file of %d bytes, want cut %v", size, tt.trimmed)
			}
			if keep != "" {
				if b, err := os.ReadFile(keep); err != nil || !bytes.HasPrefix(b, []byte("keep")) {
					t.Fatalf("%s: %.10q %v, want it untouched", keep, b, err)
				}
			}
			if !tt.trimmed {
				return
			}
			if size != int64(len(big)) {
				t.Fatalf("size %d, want %d", size, len(big))
			}
			if fi, err := os.Lstat(filepath.Join(dir, "control.log")); err != nil || fi.Size() != 0 {
				t.Fatalf("control.log after the cut: %v %v", fi, err)
			}
			if tt.errHas != "" {
				return
			}
			fi, err := os.Lstat(filepath.Join(dir, "control.log.1"))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
				t.Fatalf("control.log.1: %v %v, want a regular file of mode 0644", fi, err)
			}
			tail, _ := os.ReadFile(filepath.Join(dir, "control.log.1"))
			// The end of the file, whole lines only, about a quarter of the bound.
			if !bytes.HasSuffix(big, tail) || len(tail) > bound/4 || len(tail) < bound/4-64 || tail[0] != '[' {
				t.Fatalf("control.log.1 holds %d bytes starting %.20q, want the last whole lines of at most %d", len(tail), tail, bound/4)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Fatalf("folder holds %v, want control.log and control.log.1 only", ents)
			}
		})
	}
}

// TestRealLogTrim: the real control daemon keeps appending to control.log after
// Check cut it, from its new start.
func TestRealLogTrim(t *testing.T) {
	t.Parallel()
	const bound = 32 << 10
	d, _ := newReal(t, []string{gpuA}, 1, 2*time.Second, func(c *Config) { c.MaxLog = bound })
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(d.LogDir(gpuA, 0), "control.log")
	// Each probe logs a few hundred bytes; padding stands for a day of them.
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	pad := logLines(2 * bound / 64)
	_, err = f.Write(pad)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	d.Check(context.Background())
	// The probe after the cut goes in it; the daemon may write its line just
	// after answering, so wait for it.
	var b []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err = os.ReadFile(log); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("Cmd:get_default_active_thread_percentage")) || time.Now().After(deadline) {
			break
		}
	}
	if len(b) == 0 || len(b) > bound/4 || b[0] != '[' || !bytes.Contains(b, []byte("Cmd:get_default_active_thread_percentage")) {
		t.Fatalf("control.log after Check: %d bytes: %.200q", len(b), b)
	}
	// The padding went to the kept part; the daemon may have logged a line
	// of its own (a probe's "UI closed") after it, before the cut.
	tail, err := os.ReadFile(log + ".1")
	if err != nil || !bytes.Contains(tail, pad[len(pad)-64:]) {
		t.Fatalf("control.log.1: %v, ends %q", err, tail[max(0, len(tail)-64):])
	}
	// Without the cut, probes alone grow the log past the bound; with it, it
	// stays within.
	for range 200 {
		d.Check(context.Background())
	}
	if fi, err := os.Stat(log); err != nil || fi.Size() > bound {
		t.Fatalf("control.log after 200 checks: %v %v", fi, err)
	}
	if !answers(t, d.PipeDir(gpuA, 0)) {
		t.Fatal("daemon does not answer after its logs were cut")
	}
	// Cut and written to in turn, it holds only the daemon's lines, with no hole
	// of NUL bytes where a writer at an old offset would leave one.
	b, _ = os.ReadFile(log)
	if bytes.IndexByte(b, 0) >= 0 || len(b) == 0 || b[0] != '[' || !bytes.Contains(b, []byte("Cmd:get_server_list")) {
		t.Fatalf("control.log holds NUL bytes or no probe: %.100q", b)
	}
}
