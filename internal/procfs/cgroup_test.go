package procfs

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

func TestCgroupAndComm(t *testing.T) {
	b, err := Cgroup(os.Getpid())
	if err != nil || !bytes.Contains(b, []byte(":/")) {
		t.Fatalf("Cgroup(self) = %q, %v", b, err)
	}
	if name, err := Comm(os.Getpid()); err != nil || name == "" || name[len(name)-1] == '\n' {
		t.Fatalf("Comm(self) = %q, %v", name, err)
	}
	if _, err := Cgroup(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Cgroup of no process: %v", err)
	}
	if _, err := Comm(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Comm of no process: %v", err)
	}
}
