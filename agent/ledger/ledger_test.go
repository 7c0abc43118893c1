package ledger

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/pipefile"
)

func newTestLedger(t *testing.T) *Ledger {
	t.Helper()
	m, err := units.New(1, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(t.TempDir(), m, []GPU{{0, "GPU-a", "A"}, {1, "GPU-b", "B"}}, testGID(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// testGID is a group for the instance folders: one the process is not in when
// it runs as root, so that the test sees the folders given to it.
func testGID() int {
	if os.Geteuid() == 0 {
		return 4242
	}
	return os.Getgid()
}

func TestLayoutAndFolders(t *testing.T) {
	l := newTestLedger(t)
	if err := l.WriteLayout(func(g, k int) map[string]string { return map[string]string{"K": string(rune('0' + k))} }); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(l.Root(), pipefile.LayoutFile))
	if err != nil {
		t.Fatal(err)
	}
	var lay pipefile.Layout
	if err := json.Unmarshal(b, &lay); err != nil {
		t.Fatal(err)
	}
	if len(lay.GPUs) != 2 || lay.GPUs[1].UUID != "GPU-b" || len(lay.GPUs[1].Instances) != 2 ||
		!slices.Equal(lay.GPUs[1].Instances[1].Units, []int{4, 5, 6, 7}) || lay.GPUs[1].Instances[1].Env["K"] != "1" {
		t.Fatalf("layout %s", b)
	}
	var st unix.Stat_t
	if err := unix.Stat(l.InstanceDir(1, 1), &st); err != nil || st.Mode&0o7777 != 0o1770 || int(st.Gid) != testGID() {
		t.Fatalf("instance folder mode %#o group %d, want 1770 and %d: %v", st.Mode&0o7777, st.Gid, testGID(), err)
	}
}

func TestFolderModes(t *testing.T) {
	m := units.Default()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	run := t.TempDir()
	// No socket group: open to everyone, like /tmp.
	l, err := New(run, m, []GPU{{0, "GPU-a", "A"}}, -1, quiet)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	dir := l.InstanceDir(0, 0)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("without a group: %v %v", fi.Mode(), err)
	}
	// The next start with a group closes the folder left open.
	l, err = New(run, m, []GPU{{0, "GPU-a", "A"}}, testGID(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o7777 != 0o1770 || int(st.Gid) != testGID() {
		t.Fatalf("with a group: mode %#o group %d: %v", st.Mode&0o7777, st.Gid, err)
	}
	for _, p := range []string{l.Root(), filepath.Dir(dir)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v %v", p, fi.Mode(), err)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	// A folder someone else made is not taken over.
	if err := os.Chown(dir, 1234, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := New(run, m, []GPU{{0, "GPU-a", "A"}}, testGID(), quiet); err == nil || !strings.Contains(err.Error(), "belongs to uid 1234") {
		t.Fatalf("folder of uid 1234: %v", err)
	}
}

func TestGroupID(t *testing.T) {
	if GroupID("") != -1 || GroupID("no-such-group-gpulet-test") != -1 {
		t.Fatal("a missing group has a gid")
	}
	if GroupID("root") != 0 {
		t.Fatal("root's gid")
	}
}

func TestCreateScanRemove(t *testing.T) {
	l := newTestLedger(t)
	if err := l.Create(0, 5); err != nil {
		t.Fatal(err)
	}
	if err := l.Create(0, 5); err != ErrTaken {
		t.Fatalf("second Create: %v, want ErrTaken", err)
	}
	if _, err := os.Stat(filepath.Join(l.InstanceDir(0, 1), "unit-5")); err != nil {
		t.Fatal("FIFO not in instance 1's folder:", err)
	}
	// Foreign entries do not count: a regular file with a unit name, a symlink,
	// a unit of another instance, and a temporary claim name.
	os.WriteFile(filepath.Join(l.InstanceDir(0, 0), "unit-1"), nil, 0o644)
	os.Symlink("/dev/null", filepath.Join(l.InstanceDir(0, 0), "unit-2"))
	unix.Mkfifo(filepath.Join(l.InstanceDir(0, 0), "unit-6"), 0o600)
	unix.Mkfifo(filepath.Join(l.InstanceDir(0, 0), ".claim-1"), 0o600)
	got, err := l.Scan(0)
	if err != nil || !slices.Equal(got, []int{5}) {
		t.Fatalf("Scan = %v, %v; want [5]", got, err)
	}
	if !l.Present(0, 5) || l.Present(0, 1) || l.Present(0, 2) {
		t.Fatal("Present disagrees with what is there")
	}
	if removed, err := l.Remove(0, 5); err != nil || !removed || l.Present(0, 5) {
		t.Fatalf("Remove: %v", err)
	}
	if removed, err := l.Remove(0, 5); err != nil || removed {
		t.Fatalf("Remove of a missing FIFO: %v", err)
	}
}

func TestProbeRemovesOnlyUnlockedClaims(t *testing.T) {
	l := newTestLedger(t)
	// A live claim: a FIFO whose lock is held by an open descriptor.
	held := l.Path(1, 0)
	unix.Mkfifo(held, 0o600)
	fd, err := unix.Open(held, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	unix.Mkfifo(l.Path(1, 1), 0o600)
	_, heldID, _ := l.Stat(1, 0)
	_, freeID, _ := l.Stat(1, 1)
	if stale, err := l.Probe(1, 0, heldID); err != nil || stale || !l.Present(1, 0) {
		t.Fatalf("locked claim: stale=%v err=%v present=%v", stale, err, l.Present(1, 0))
	}
	// A FIFO other than the one expected is never removed.
	if stale, err := l.Probe(1, 1, heldID); err != nil || stale || !l.Present(1, 1) {
		t.Fatalf("unexpected FIFO: stale=%v err=%v present=%v", stale, err, l.Present(1, 1))
	}
	if stale, err := l.Probe(1, 1, freeID); err != nil || !stale || l.Present(1, 1) {
		t.Fatalf("unlocked claim: stale=%v err=%v present=%v", stale, err, l.Present(1, 1))
	}
}

func TestNewRefusesSymlinkedFolder(t *testing.T) {
	dir := t.TempDir()
	os.Symlink(t.TempDir(), filepath.Join(dir, "units"))
	m := units.Default()
	if _, err := New(dir, m, []GPU{{0, "GPU-a", "A"}}, -1, slog.Default()); err == nil {
		t.Fatal("New followed a symlinked units folder")
	}
}

// TestProbeKnowsAClaimSeenMidProtocol: the daemon may count a claim between the
// claimer's link and its unlink of the temporary name, which changes the FIFO's
// change time; the identity recorded then must still match at the probe.
func TestProbeKnowsAClaimSeenMidProtocol(t *testing.T) {
	l := newTestLedger(t)
	tmp := filepath.Join(l.InstanceDir(0, 0), ".claim-x")
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Flock(fd, unix.LOCK_EX)
	if err := unix.Link(tmp, l.Path(0, 1)); err != nil {
		t.Fatal(err)
	}
	_, seen, ok := l.Stat(0, 1)
	if !ok {
		t.Fatal("claim not seen")
	}
	// The unlink must give the FIFO a later change time: wait until the
	// file clock, which ticks coarsely, has moved past the link's.
	linked := ctime(t, tmp)
	clock := filepath.Join(t.TempDir(), "clock")
	testutil.Eventually(t, "the file clock to move past the link", func() bool {
		if err := os.WriteFile(clock, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return ctime(t, clock) > linked
	})
	unix.Unlink(tmp)
	if ctime(t, l.Path(0, 1)) == linked {
		t.Fatal("the unlink left the FIFO's change time as it was")
	}
	if stale, err := l.Probe(0, 1, seen); err != nil || stale {
		t.Fatalf("held claim: stale=%v err=%v", stale, err)
	}
	unix.Close(fd)
	if stale, err := l.Probe(0, 1, seen); err != nil || !stale || l.Present(0, 1) {
		t.Fatalf("abandoned claim: stale=%v err=%v present=%v", stale, err, l.Present(0, 1))
	}
}

// ctime is path's change time in nanoseconds.
func ctime(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ctim.Nano()
}

type recordingHandler struct {
	mu     sync.Mutex
	events []UnitEvent
}

func (h *recordingHandler) Units(evs []UnitEvent) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, evs...)
	return true
}

func (h *recordingHandler) Rescan() {}

func (h *recordingHandler) seen() []UnitEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// The watch passes on a unit name's coming and going, not a claimer's other
// touches of it, and the next Sweep says loudly when an instance folder itself
// went.
func TestWatchEvents(t *testing.T) {
	m, err := units.New(1, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	l, err := New(t.TempDir(), m, []GPU{{0, "GPU-a", "A"}}, testGID(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &recordingHandler{}
	if err := l.Watch(ctx, h); err != nil {
		t.Fatal(err)
	}
	// A claim by the protocol: temporary name, link, unlink; then a chmod.
	tmp := filepath.Join(l.InstanceDir(0, 0), ".claim")
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Link(tmp, l.Path(0, 1)); err != nil {
		t.Fatal(err)
	}
	unix.Unlink(tmp)
	os.Chmod(l.Path(0, 1), 0o644)
	os.Remove(l.Path(0, 1))
	want := []UnitEvent{{GPU: 0, Unit: 1}, {GPU: 0, Unit: 1, Gone: true}}
	testutil.Eventually(t, "the claim's unit events", func() bool { return len(h.seen()) >= len(want) })
	// Anything else would have come in order before the removal.
	if got := h.seen(); !slices.Equal(got, want) {
		t.Fatalf("unit events %+v, want %+v", got, want)
	}
	// Instance 1's folder is empty: remove it.
	if err := os.Remove(l.InstanceDir(0, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "an error logged for a removed instance folder", func() bool {
		l.Sweep()
		return strings.Contains(logs.String(), "instance folder was removed")
	})
	if n := strings.Count(logs.String(), "instance folder was removed"); n != 1 {
		t.Fatalf("the removed folder logged %d times:\n%s", n, logs.String())
	}
}

// An offline claim belongs to its FIFO's owner; a symlink at a unit name is no
// claim, whoever owns what it points to.
func TestStatIsTheFIFOsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give FIFOs to other uids; runs as", os.Geteuid())
	}
	l := newTestLedger(t)
	if err := unix.Mkfifo(l.Path(0, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(l.Path(0, 1), 3001, -1); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(target, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(target, 3002, -1)
	if err := os.Symlink(target, l.Path(0, 2)); err != nil {
		t.Fatal(err)
	}
	os.Lchown(l.Path(0, 2), 3003, -1)
	if uid, _, ok := l.Stat(0, 1); !ok || uid != 3001 {
		t.Fatalf("FIFO of uid 3001: uid %d ok %v", uid, ok)
	}
	if uid, _, ok := l.Stat(0, 2); ok {
		t.Fatalf("a symlink to a FIFO counted as a claim of uid %d", uid)
	}
	if l.Present(0, 2) || l.Held(0, 2) {
		t.Fatal("a symlink to a FIFO is present or held")
	}
	if stale, err := l.Probe(0, 2, FileID{}); stale || err != nil {
		t.Fatalf("Probe of a symlink: stale=%v err=%v", stale, err)
	}
}

// heldHandler holds the watch in its handler until released.
type heldHandler struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *heldHandler) Units([]UnitEvent) bool {
	h.once.Do(func() { close(h.entered) })
	<-h.release
	return false
}

func (h *heldHandler) Rescan() {}

// Close waits for the watch to end: a watch still in its handler reads the
// folders that Close releases.
func TestCloseWaitsForTheWatch(t *testing.T) {
	m, err := units.New(1, 4, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(t.TempDir(), m, []GPU{{0, "GPU-a", "A"}}, testGID(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldHandler{entered: make(chan struct{}), release: make(chan struct{})}
	if err := l.Watch(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(l.Path(0, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	<-h.entered
	cancel()
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	// A negative wait, which cannot pass by chance: Close cannot return
	// while the handler holds the watch.
	select {
	case <-closed:
		t.Fatal("Close returned while the watch was in its handler")
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	<-closed
}
