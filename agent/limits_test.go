package agent

import (
	"io"
	"log/slog"
	"syscall"
	"testing"
)

func TestRaiseFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Max < 512 {
		t.Skipf("hard limit %d leaves no room to lower the soft one", orig.Max)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	low := syscall.Rlimit{Cur: 256, Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	raiseFileLimit(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var got syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &got)
	if got.Cur != orig.Max {
		t.Fatalf("soft limit %d after raising, want the hard limit %d", got.Cur, orig.Max)
	}
}
