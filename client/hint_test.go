package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A socket path longer than a Unix socket can have is named with the limit,
// not the kernel's "invalid argument".
func TestSocketPathTooLong(t *testing.T) {
	path := "/" + strings.Repeat("x", MaxSocketPath) // 108 bytes
	_, err := (&Client{Socket: path}).Snapshot(context.Background())
	want := "cannot reach gpuletd: socket path too long: " + path + " is 108 bytes, and a Unix socket path holds at most 107: choose a shorter one"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, ErrNoDaemon) || !errors.Is(err, ErrSocketPathTooLong) {
		t.Fatalf("got %v\nwant %q…", err, want)
	}
	if CheckSocketPath(path[:MaxSocketPath]) != nil {
		t.Fatal("a path of 107 bytes was refused")
	}
}

// With no socket chosen and no daemon at the default, the hint names the
// socket of a private gpuletd of make run's, with its export line.
func TestNoDaemonHint(t *testing.T) {
	runtime := t.TempDir()
	env := map[string]string{"XDG_RUNTIME_DIR": runtime}
	getenv := func(k string) string { return env[k] }
	c := &Client{}
	if h := c.NoDaemonHint(getenv); h != "" && !strings.Contains(h, "/tmp/gpulet-") {
		t.Fatalf("hint with no private socket: %q", h)
	}
	sock := filepath.Join(runtime, "gpulet", "gpulet.sock")
	if err := os.Mkdir(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := "a private gpuletd (make run's) has its socket at " + sock + ": export GPULET_SOCKET=" + sock
	if h := c.NoDaemonHint(getenv); h != want {
		t.Errorf("got %q\nwant %q", h, want)
	}
	// A socket the user chose is where they meant gpuletd to be.
	if h := (&Client{Socket: "/x.sock"}).NoDaemonHint(getenv); h != "" {
		t.Errorf("hint beside --socket: %q", h)
	}
	env[SocketEnv] = "/x.sock"
	if h := c.NoDaemonHint(getenv); h != "" {
		t.Errorf("hint beside GPULET_SOCKET: %q", h)
	}
}

// The permission advice names the socket's own group and the command that
// adds the user to it.
func TestPermissionAdvice(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give a file to a group the test is not in")
	}
	f := filepath.Join(t.TempDir(), "gpulet.sock")
	if err := os.WriteFile(f, nil, 0o660); err != nil {
		t.Fatal(err)
	}
	// nogroup (65534) is in Debian's group database, and root is not in it.
	if err := os.Chown(f, 0, 65534); err != nil {
		t.Fatal(err)
	}
	got := permissionAdvice(f)
	want := "your user must be in the socket's group, nogroup: sudo usermod -aG nogroup $USER, then log in again"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
