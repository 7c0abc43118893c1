package ledger

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/testutil"
)

// A local user may mount a FUSE file system of their own on a folder or a
// file they put at a unit name, or deeper in such a folder (fusermount3 lets
// them), and root may then not even look at it. Such a mount is no claim: it
// must neither keep the unit from the daemon for good nor hide the GPU's
// claims from a scan.
func TestSweepDetachesAUsersMountAtAUnitName(t *testing.T) {
	var logs testutil.SyncBuffer
	l := newLoggedLedger(t, &logs)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Unit 0: a claim. Unit 1: a user's folder, mounted on. Unit 2: a user's
	// folder with a folder and a file inside it mounted on.
	must(unix.Mkfifo(l.Path(0, 0), 0o600))
	must(os.Mkdir(l.Path(0, 1), 0o755))
	lchown(t, l.Path(0, 1), 65534)
	testutil.MountOthersFUSE(t, l.Path(0, 1))
	sub := filepath.Join(l.Path(0, 2), "a", "b")
	must(os.MkdirAll(sub, 0o755))
	lchown(t, l.Path(0, 2), 65534)
	file := filepath.Join(l.Path(0, 2), "f")
	must(os.WriteFile(file, nil, 0o644))
	testutil.MountOthersFUSE(t, sub)
	testutil.MountOthersFUSE(t, file)
	if _, err := os.Lstat(l.Path(0, 1)); err == nil {
		t.Fatal("root can look at the mount: the test shows nothing")
	}

	if got, err := l.Scan(0); err != nil || !slices.Equal(got, []int{0}) {
		t.Fatalf("Scan of the GPU = %v, %v; want its claim [0]", got, err)
	}
	got := l.Sweep()
	want := []Removed{
		{GPU: 0, Instance: 0, Unit: 1, Path: l.Path(0, 1), Type: "folder", UID: wantUID(65534)},
		{GPU: 0, Instance: 0, Unit: 2, Path: l.Path(0, 2), Type: "folder", UID: wantUID(65534)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Sweep removed\n%+v\nwant\n%+v\nlog:\n%s", got, want, logs.String())
	}
	for _, i := range []int{1, 2} {
		if _, err := os.Lstat(l.Path(0, i)); !os.IsNotExist(err) {
			t.Fatalf("unit-%d still there: %v", i, err)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(b), l.Root()) {
		t.Fatalf("a mount under the ledger is left (%v):\n%s", err, b)
	}
	if !l.Present(0, 0) {
		t.Fatal("the claim went too")
	}
	if err := l.Create(0, 1); err != nil {
		t.Fatalf("unit 1 is not free for the daemon's FIFO again: %v", err)
	}
}
