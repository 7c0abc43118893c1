package agent

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The socket has the mode asked from the moment it exists, whatever the
// umask: with none at all it is not open to everyone, not even for a moment
// (nothing changes its mode after the bind here).
func TestSocketIsNeverWiderThanAsked(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := listenUnix(path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket made as %v under umask 0, want a socket of mode 0660", fi.Mode())
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ln.SetUnlinkOnClose(true)
	ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket left after Close: %v", err)
	}
	if _, err := listenUnix(filepath.Join(t.TempDir(), "no", "such", "folder"), 0o660); err == nil {
		t.Fatal("a socket in a missing folder was made")
	}
}
