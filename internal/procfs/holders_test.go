package procfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// A FIFO opened here and handed to a child: once this process closes its
// own descriptor, the child alone holds it, and a file of the same folder
// nobody holds is held by no one.
func TestHoldersFollowTheDescriptor(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "unit-0")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	id := func(p string) File {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return File{Dev: st.Dev, Ino: st.Ino}
	}
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "30")
	child.ExtraFiles = []*os.File{f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	me := os.Getpid()
	if !Holds(me, id(fifo), dir) || !Holds(child.Process.Pid, id(fifo), dir) {
		t.Fatal("a holder of the FIFO not seen")
	}
	f.Close()
	if Holds(me, id(fifo), dir) {
		t.Fatal("the FIFO still seen held here after its descriptor closed")
	}
	if Holds(child.Process.Pid, id(fifo), t.TempDir()) {
		t.Fatal("a descriptor outside the folder looked at")
	}
	got, err := Holders(map[File]bool{id(fifo): true, id(other): true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[id(fifo)], []int{child.Process.Pid}) || got[id(other)] != nil {
		t.Fatalf("Holders = %v, want the child %d alone", got, child.Process.Pid)
	}
}
