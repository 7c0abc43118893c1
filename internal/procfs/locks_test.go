package procfs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseLocks(t *testing.T) {
	in := `1: FLOCK  ADVISORY  WRITE 4242 00:19:5678 0 EOF
1: -> FLOCK  ADVISORY  WRITE 4343 00:19:5678 0 EOF
2: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF
3: FLOCK  ADVISORY  WRITE 5000 fd:0a:123 0 EOF
4: FLOCK  ADVISORY  WRITE x 00:19:1 0 EOF
garbage
`
	got, err := ParseLocks(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[LockedFile]int{{0, 0x19, 5678}: 4242, {0xfd, 0x0a, 123}: 5000}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// TestFlockHoldersFindsOurLock: a flock this process takes shows with its pid.
func TestFlockHoldersFindsOurLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	held, err := FlockHolders()
	if err != nil {
		t.Skipf("no /proc/locks here: %v", err)
	}
	key := LockedFile{Major: unix.Major(uint64(st.Dev)), Minor: unix.Minor(uint64(st.Dev)), Inode: st.Ino}
	if held[key] != os.Getpid() {
		t.Fatalf("holder of %+v is %d, want this process %d", key, held[key], os.Getpid())
	}
}

func FuzzParseLocks(f *testing.F) {
	f.Add([]byte("1: FLOCK  ADVISORY  WRITE 4242 00:19:5678 0 EOF\n"))
	f.Add([]byte("1: FLOCK ADVISORY WRITE 1 ffffffffff:0:1 0 EOF\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, _ := ParseLocks(strings.NewReader(string(b)))
		for _, pid := range got {
			if pid <= 0 {
				t.Fatalf("pid %d kept", pid)
			}
		}
	})
}
