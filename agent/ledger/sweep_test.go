package ledger

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/pipefile"
)

func newLoggedLedger(t *testing.T, logs io.Writer) *Ledger {
	t.Helper()
	m, err := units.New(1, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(t.TempDir(), m, []GPU{{0, "GPU-a", "A"}, {1, "GPU-b", "B"}}, testGID(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// lchown gives an entry, not what it points to, to uid.
func lchown(t *testing.T, p string, uid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Lchown(p, uid, -1); err != nil {
		t.Fatal(err)
	}
}

// wantUID is what lchown made of an entry's owner.
func wantUID(uid int) uint32 {
	if os.Geteuid() != 0 {
		return uint32(os.Geteuid())
	}
	return uint32(uid)
}

func TestSweepRemovesWhatIsNoClaim(t *testing.T) {
	var logs testutil.SyncBuffer
	l := newLoggedLedger(t, &logs)
	// Targets outside the ledger, which must stay as they are.
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	inst0 := l.InstanceDir(0, 0)
	at := func(g, i int) string { return l.Path(g, i) }
	// GPU 0 instance 0 holds units 0-3, instance 1 units 4-7.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(at(0, 0), []byte("x"), 0o644))
	lchown(t, at(0, 0), 2001)
	must(os.Symlink(secret, at(0, 1)))
	lchown(t, at(0, 1), 2002)
	// A folder with a symlink to a folder outside, a file, and a chain deeper
	// than the folders Sweep keeps open at once.
	must(os.Mkdir(at(0, 2), 0o755))
	lchown(t, at(0, 2), 2003)
	must(os.Symlink(outside, filepath.Join(at(0, 2), "out")))
	must(os.WriteFile(filepath.Join(at(0, 2), "f"), nil, 0o644))
	deep := at(0, 2)
	for d := 0; d < 3*maxOpenDepth; d++ {
		deep = filepath.Join(deep, "d")
		must(os.Mkdir(deep, 0o755))
	}
	must(os.Symlink(secret, filepath.Join(deep, "s")))
	ln, err := net.Listen("unix", at(0, 3))
	must(err)
	defer ln.Close()
	// What stays: a FIFO (a claim, or the daemon's), and a FIFO at another
	// name while it may still be a claim's temporary name.
	must(unix.Mkfifo(at(1, 5), 0o600))
	tmpFIFO := filepath.Join(inst0, ".claim-1-0000")
	must(unix.Mkfifo(tmpFIFO, 0o600))
	// Strays, whatever their name: gpuletd made none of them, and a file
	// among them could fill the run dir.
	stray := func(name string, uid int) Removed {
		p := filepath.Join(inst0, name)
		must(os.WriteFile(p, []byte("fill"), 0o644))
		lchown(t, p, uid)
		return Removed{GPU: 0, Instance: 0, Unit: -1, Path: p, Type: "file", UID: wantUID(uid)}
	}

	want := []Removed{
		{GPU: 0, Instance: 0, Unit: 0, Path: at(0, 0), Type: "file", UID: wantUID(2001)},
		{GPU: 0, Instance: 0, Unit: 1, Path: at(0, 1), Type: "symlink", UID: wantUID(2002)},
		{GPU: 0, Instance: 0, Unit: 2, Path: at(0, 2), Type: "folder", UID: wantUID(2003)},
		{GPU: 0, Instance: 0, Unit: 3, Path: at(0, 3), Type: "socket", UID: uint32(os.Geteuid())},
		stray("unit-5", 2004), stray("junk", 2005), stray(".claim-x", 2006), stray("unit-01", 2007),
	}
	got := l.Sweep()
	byPath := func(a, b Removed) int { return strings.Compare(a.Path, b.Path) }
	slices.SortFunc(got, byPath)
	slices.SortFunc(want, byPath)
	if !slices.Equal(got, want) {
		t.Fatalf("Sweep removed\n%+v\nwant\n%+v", got, want)
	}
	for _, w := range want {
		if _, err := os.Lstat(w.Path); !os.IsNotExist(err) {
			t.Fatalf("%s still there: %v", w.Path, err)
		}
	}
	for _, p := range []string{at(1, 5), tmpFIFO} {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s was removed: %v", p, err)
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "keep" {
		t.Fatalf("symlink target changed: %q %v", b, err)
	}
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 1 {
		t.Fatalf("folder outside changed: %v %v", ents, err)
	}
	for _, w := range want {
		line := fmt.Sprintf("path=%s type=%s uid=%d", w.Path, w.Type, w.UID)
		if w.Unit < 0 {
			line += " bytes=4"
		}
		if n := strings.Count(logs.String(), line); n != 1 {
			t.Fatalf("%q logged %d times:\n%s", line, n, logs.String())
		}
	}
	// Nothing left to remove, nothing logged again.
	before := logs.String()
	if got := l.Sweep(); len(got) != 0 || logs.String() != before {
		t.Fatalf("second Sweep removed %+v and logged\n%s", got, strings.TrimPrefix(logs.String(), before))
	}
	// A temporary name past any claim's time is a leftover.
	l.now = func() time.Time { return time.Now().Add(strayFIFOGrace + time.Second) }
	if got := l.Sweep(); len(got) != 1 || got[0].Path != tmpFIFO || got[0].Type != "FIFO" {
		t.Fatalf("Sweep after the grace removed %+v, want %s", got, tmpFIFO)
	}
	if _, err := os.Lstat(at(1, 5)); err != nil {
		t.Fatalf("claim removed: %v", err)
	}
	// The unit is free for the daemon's FIFO again.
	if err := l.Create(0, 1); err != nil {
		t.Fatal(err)
	}
}

// A folder too big for one Sweep's budget goes over several, and is logged
// once, when gone.
func TestSweepFinishesABigFolderLater(t *testing.T) {
	var logs testutil.SyncBuffer
	l := newLoggedLedger(t, &logs)
	l.sweepBudget = 100
	dir := l.Path(1, 6)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 2*l.sweepBudget+10; j++ {
		if err := unix.Mknodat(fd, fmt.Sprintf("f%d", j), unix.S_IFREG|0o644, 0); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(fd)
	sweeps := 0
	for {
		sweeps++
		got := l.Sweep()
		if len(got) == 1 {
			break
		}
		if len(got) != 0 || sweeps > 5 {
			t.Fatalf("sweep %d removed %+v", sweeps, got)
		}
	}
	if sweeps != 3 {
		t.Fatalf("removed after %d sweeps, want 3 for %d entries", sweeps, 2*l.sweepBudget+10)
	}
	if n := strings.Count(logs.String(), "path="+dir); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs.String())
	}
}

// blockingHandler is a log that never returns while the test runs: whoever
// logs through it is stuck.
type blockingHandler struct {
	release <-chan struct{}
	calls   *atomic.Int32
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) Handle(context.Context, slog.Record) error {
	h.calls.Add(1)
	<-h.release
	return nil
}
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingHandler) WithGroup(string) slog.Handler      { return h }

// claimsHandler records the units seen claimed, from events and rescans.
type claimsHandler struct {
	l    *Ledger
	mu   sync.Mutex
	seen map[[2]int]bool
}

func (h *claimsHandler) Units(evs []UnitEvent) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range evs {
		h.seen[[2]int{ev.GPU, ev.Unit}] = !ev.Gone && h.l.Present(ev.GPU, ev.Unit)
	}
	return true
}

func (h *claimsHandler) Rescan() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for g := range h.l.gpus {
		units, _ := h.l.Scan(g)
		for _, u := range units {
			h.seen[[2]int{g, u}] = true
		}
	}
}

func (h *claimsHandler) has(g, u int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[[2]int{g, u}]
}

// TestClaimSeenThroughAFloodOfJunk: 30,000 junk names in an instance folder,
// and the log stuck. The watch must still count offline claims on both GPUs:
// it neither waits on the log for the junk nor for the events it loses in the
// flood.
func TestClaimSeenThroughAFloodOfJunk(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	m, err := units.New(1, 4, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(t.TempDir(), m, []GPU{{0, "GPU-a", "A"}, {1, "GPU-b", "B"}}, testGID(), slog.New(blockingHandler{release, &calls}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		close(release)
		l.Close()
	})
	h := &claimsHandler{l: l, seen: map[[2]int]bool{}}
	if err := l.Watch(ctx, h); err != nil {
		t.Fatal(err)
	}
	junk, err := pipefile.OpenFolder(l.InstanceDir(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	// Names of every kind the old watch looked at and logged: no unit names,
	// unit names of the other instance, temporary-looking names.
	for j := 0; j < 30000; j++ {
		var name string
		switch j % 3 {
		case 0:
			name = fmt.Sprintf("junk-%d", j)
		case 1:
			name = fmt.Sprintf("unit-%d%d", 4+j%4, j)
		case 2:
			name = fmt.Sprintf(".x-%d", j)
		}
		if err := unix.Mknodat(junk.FD(), name, unix.S_IFREG|0o644, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ g, u int }{{1, 5}, {0, 2}} {
		f, err := pipefile.OpenFolder(l.InstanceDir(c.g, m.InstanceOf(c.u)))
		if err != nil {
			t.Fatal(err)
		}
		fd, ok, err := f.Claim(c.u)
		f.Close()
		if err != nil || !ok {
			t.Fatalf("claim of GPU %d unit %d: %v %v", c.g, c.u, ok, err)
		}
		defer unix.Close(fd)
	}
	testutil.Eventually(t, "both claims seen", func() bool { return h.has(1, 5) && h.has(0, 2) })
	if n := calls.Load(); n != 0 {
		t.Fatalf("the watch logged %d lines for junk", n)
	}
}

// A flood of strays in one folder is read a bounded number of names per
// Sweep, from where the last stopped, and takes no turn from other folders.
func TestSweepReadsStraysOnInBoundedSteps(t *testing.T) {
	var logs testutil.SyncBuffer
	l := newLoggedLedger(t, &logs)
	l.strayReads = 100
	fd, err := unix.Open(l.InstanceDir(0, 0), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const flood = 250
	for j := 0; j < flood; j++ {
		if err := unix.Mknodat(fd, fmt.Sprintf(".fill-%d", j), unix.S_IFREG|0o644, 0); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(fd)
	other := filepath.Join(l.InstanceDir(1, 1), ".fill")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	removed := 0
	for sweep := 1; removed < flood+1; sweep++ {
		got := l.Sweep()
		if len(got) > l.strayReads+1 {
			t.Fatalf("sweep %d removed %d entries, more than it may read", sweep, len(got))
		}
		if sweep == 1 && !slices.ContainsFunc(got, func(r Removed) bool { return r.Path == other }) {
			t.Fatalf("first sweep left %s for the flood elsewhere", other)
		}
		removed += len(got)
		if sweep > 5 {
			t.Fatalf("%d of %d strays removed after %d sweeps", removed, flood+1, sweep)
		}
	}
}
