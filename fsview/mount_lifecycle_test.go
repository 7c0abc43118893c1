package fsview

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/snapshot"
)

// TestMountReplacesStaleMount kills a process serving a view, which leaves a
// dead mount behind, and mounts again at the same place.
func TestMountReplacesStaleMount(t *testing.T) {
	requireFUSE(t)
	dir := filepath.Join(t.TempDir(), "view")
	t.Cleanup(func() {
		if mountedAt(t, dir) {
			detach(dir)
		}
	})

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "mounted\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q, %v", line, err)
	}
	if got := readFile(t, filepath.Join(dir, "free_units")); got != "5\n" {
		t.Errorf("child's view: free_units = %q, want 5", got)
	}
	cmd.Process.Kill()
	cmd.Wait()
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statfs after the server died: %v, want ENOTCONN", err)
	}
	if _, err := os.ReadFile(filepath.Join(dir, "free_units")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("read after the server died: %v, want ENOTCONN", err)
	}

	var store snapshot.Store
	store.Store(publish(t, testSnapshot(2, 9)))
	mountAt(t, dir, &store)
	if got := readFile(t, filepath.Join(dir, "free_units")); got != "9\n" {
		t.Errorf("free_units = %q on the new mount, want 9", got)
	}
}

func TestMountRefusesLiveMount(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(1, 1)))
	_, dir := mountView(t, &store)
	v, err := Mount(dir, &store, Options{Logger: quietLogger()})
	if err == nil {
		v.Close()
		t.Fatal("second Mount on a live view succeeded")
	}
	if want := "cannot mount view at " + dir + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to start with %q", err, want)
	}
	if got := readFile(t, filepath.Join(dir, "free_units")); got != "1\n" {
		t.Errorf("first view after the refused mount: free_units = %q", got)
	}
}

func TestMountErrors(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var store snapshot.Store
	tests := []struct {
		name string
		dir  string
		src  Source
		want string
	}{
		{"no source", filepath.Join(base, "a"), nil, "no snapshot source"},
		{"dir is a file", file, &store, "not a directory"},
		{"parent is a file", filepath.Join(file, "view"), &store, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Mount(tc.dir, tc.src, Options{Logger: quietLogger()})
			if err == nil {
				v.Close()
				t.Fatal("Mount succeeded")
			}
			if !strings.HasPrefix(err.Error(), "cannot mount view at "+tc.dir+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q about %s", err, tc.want, tc.dir)
			}
		})
	}
}

func TestCloseUnmounts(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(1, 1)))
	requireFUSE(t)

	tests := []struct {
		name string
		busy bool // a file of the view is open while Close runs
	}{
		{"idle", false},
		{"busy", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "view")
			v, err := Mount(dir, &store, Options{Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if !mountedAt(t, dir) {
				t.Fatal("mountinfo does not list the view")
			}
			if tc.busy {
				f, err := os.Open(filepath.Join(dir, "free_units"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
			}
			if err := v.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if mountedAt(t, dir) {
				t.Error("mountinfo still lists the view after Close")
			}
			if err := v.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}
