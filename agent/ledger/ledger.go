// Package ledger is gpuletd's side of the pipe-file ledger of docs/design.md
// §5: one FIFO per unit in use at <run-dir>/units/<gpu-uuid>/<instance>/unit-<i>.
// It creates the folders and layout.json, makes and removes the daemon's own
// FIFOs, looks at and watches the unit names, probes offline claims for
// staleness and sweeps away what sits at a unit name without being a FIFO.
// What the daemon and offline claimers share (names, layout.json, the claim
// protocol) is package pipefile's. It keeps no record of who holds what: that
// is the lease manager's.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/internal/statefile"
	"github.com/gpulet/gpulet/pipefile"
)

// GPU is what the ledger needs of a GPU.
type GPU struct {
	Index int
	UUID  string
	Name  string
}

// Lines a second the ledger logs of what local users cause: entries swept
// away, and the watch's troubles (a flood of names overflows its queue).
const (
	sweptLinesPerSecond = 10
	watchLinesPerSecond = 5
)

// Ledger is the pipe-file folder tree of one daemon.
type Ledger struct {
	runDir string
	model  units.Model
	gpus   []GPU
	log    *slog.Logger
	// dirs holds, by GPU index and instance, the instance folder, opened
	// once: FIFOs are made, removed and looked at relative to it, without
	// building and walking their path on every lease, and without following
	// anything planted at a unit name.
	dirs [][]*pipefile.Folder
	// gid is the socket group's (-1: none): the group of the instance
	// folders of a GPU open to the ledger's audience (access.go).
	gid int

	// sweptLog and watchLog bound the lines that users in the socket group
	// can cause; there is no per-name record of what was logged.
	sweptLog *ratelog.Limiter
	watchLog *ratelog.Limiter
	// What the watch saw and Sweep logs, so that the watch never waits on
	// the log: events lost, watch errors, and instance folders removed (by
	// index g*K+k).
	lost, watchErrs atomic.Uint64
	lastWatchErr    atomic.Pointer[string]
	folderGone      []atomic.Bool
	// trash numbers the names that Sweep moves too-deep folders to.
	trash atomic.Uint64
	// sweepBudget is defaultSweepBudget, less in tests.
	sweepBudget int
	// strays holds, like dirs, each instance folder open for listing, read
	// on by each Sweep from where the last one stopped (strays.go); nil
	// until first listed. strayReads is defaultStrayReads, less in tests;
	// now tells the age of a stray FIFO.
	strays     [][]*dirFile
	strayReads int
	now        func() time.Time
	// watching counts the watches' goroutines, which Close waits for.
	watching sync.WaitGroup
}

// GroupID is the gid of the group name, -1 for "" or a group that does not
// exist: what New takes for --socket-group.
func GroupID(name string) int {
	if name == "" {
		return -1
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1
	}
	return gid
}

// New prepares the ledger under runDir: it creates units/<uuid>/<k>/ for every
// GPU and instance. Instance folders belong to the group gid, mode 1770, so
// that the ledger has the socket's audience: its members may claim offline
// and, by the sticky bit, remove only their own FIFOs; other users cannot
// create, list or look at anything there. A gid below 0 (no socket group)
// leaves them open to every user, 1777, like /tmp.
func New(runDir string, model units.Model, gpus []GPU, gid int, log *slog.Logger) (*Ledger, error) {
	l := &Ledger{
		runDir: runDir, model: model, gpus: gpus, log: log, gid: gid,
		sweptLog:    ratelog.New(log, "pipe-file ledger entries removed", sweptLinesPerSecond, nil),
		watchLog:    ratelog.New(log, "pipe-file ledger watch", watchLinesPerSecond, nil),
		folderGone:  make([]atomic.Bool, len(gpus)*model.InstancesPerGPU),
		sweepBudget: defaultSweepBudget,
		strayReads:  defaultStrayReads,
		now:         time.Now,
	}
	mode := uint32(0o1770)
	if gid < 0 {
		mode = 0o1777
		log.Warn("no socket group: the pipe-file ledger's instance folders are open to every local user (mode 1777)")
	}
	if err := prepareDir(l.Root(), 0o755, -1); err != nil {
		return nil, err
	}
	l.dirs = make([][]*pipefile.Folder, len(gpus))
	l.strays = make([][]*dirFile, len(gpus))
	for _, g := range gpus {
		if err := prepareDir(filepath.Join(l.Root(), g.UUID), 0o755, -1); err != nil {
			l.Close()
			return nil, err
		}
		for k := 0; k < model.InstancesPerGPU; k++ {
			dir := l.InstanceDir(g.Index, k)
			if err := prepareDir(dir, mode, gid); err != nil {
				l.Close()
				return nil, err
			}
			f, err := pipefile.OpenFolder(dir)
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("ledger: %w", err)
			}
			l.dirs[g.Index] = append(l.dirs[g.Index], f)
			l.strays[g.Index] = append(l.strays[g.Index], nil)
		}
	}
	return l, nil
}

// prepareDir makes dir if missing, refuses one that is a symlink, not a
// directory or not the daemon's, and sets its group (gid ≥ 0) and mode
// through a descriptor, so that the daemon never changes anything through a
// link planted in its tree. A folder left by an earlier run with another mode
// gets this one.
func prepareDir(dir string, mode uint32, gid int) error {
	// Made closed and opened up below, once its group is right.
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("ledger: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ledger: %s: %w (it must be a directory, not a symlink)", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("ledger: %s: %w", dir, err)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("ledger: %s belongs to uid %d, not to gpuletd's uid %d; remove it", dir, st.Uid, euid)
	}
	if gid >= 0 && int(st.Gid) != gid {
		if err := unix.Fchown(fd, -1, gid); err != nil {
			return fmt.Errorf("ledger: giving %s to group %d: %w", dir, gid, err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("ledger: %s: %w", dir, err)
	}
	return nil
}

// Close releases the instance folders' descriptors, once every watch has
// ended: the contexts of its watches must be done, or it waits for them.
func (l *Ledger) Close() error {
	// A watch reads the folders through the handler: it ends first.
	l.watching.Wait()
	for _, fs := range l.dirs {
		for _, f := range fs {
			f.Close()
		}
	}
	l.dirs = nil
	for _, ds := range l.strays {
		for _, d := range ds {
			if d != nil {
				d.Close()
			}
		}
	}
	l.strays = nil
	return nil
}

// dirOf is the folder that holds unit i of GPU g.
func (l *Ledger) dirOf(g, i int) *pipefile.Folder { return l.dirs[g][l.model.InstanceOf(i)] }

// Root is <run-dir>/units.
func (l *Ledger) Root() string { return pipefile.UnitsRoot(l.runDir) }

// InstanceDir is the folder of instance k of GPU index g.
func (l *Ledger) InstanceDir(g, k int) string {
	return pipefile.InstanceDir(l.runDir, l.gpus[g].UUID, k)
}

// Path is the FIFO path of unit i of GPU index g.
func (l *Ledger) Path(g, i int) string {
	return filepath.Join(l.InstanceDir(g, l.model.InstanceOf(i)), pipefile.UnitName(i))
}

// WriteLayout writes layout.json atomically (temp file and rename), readable by
// everyone. env gives the environment of instance k of GPU index g.
func (l *Ledger) WriteLayout(env func(g, k int) map[string]string) error {
	lay := pipefile.Layout{Schema: pipefile.LayoutSchema}
	for _, g := range l.gpus {
		lg := pipefile.LayoutGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, UnitsTotal: l.model.UnitsPerGPU}
		for k := 0; k < l.model.InstancesPerGPU; k++ {
			lg.Instances = append(lg.Instances, pipefile.LayoutInstance{Instance: k, Units: l.model.InstanceUnits(k), Env: env(g.Index, k)})
		}
		lay.GPUs = append(lay.GPUs, lg)
	}
	b, err := json.MarshalIndent(lay, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	path := filepath.Join(l.Root(), pipefile.LayoutFile)
	// Written only when it changes: a restart on a full run dir must not
	// fail for want of room to write what is already there.
	if old, err := os.ReadFile(path); err == nil && string(old) == string(b) {
		return nil
	}
	return statefile.Replace(path, b, 0o644)
}

// ErrTaken is returned by Create when something is at the unit's name already.
var ErrTaken = errors.New("unit taken")

// Create makes the FIFO of unit i of GPU g for a lease. ErrTaken means someone
// (an offline claimer) made it first, or something that Sweep will remove
// sits there.
func (l *Ledger) Create(g, i int) error {
	err := unix.Mknodat(l.dirOf(g, i).FD(), pipefile.UnitName(i), unix.S_IFIFO|0o600, 0)
	if errors.Is(err, unix.EEXIST) {
		return ErrTaken
	}
	if err != nil {
		return fmt.Errorf("ledger: mkfifo %s: %w", l.Path(g, i), err)
	}
	return nil
}

// Remove deletes the FIFO of unit i of GPU g and says whether there was one to
// delete; a missing one is fine.
func (l *Ledger) Remove(g, i int) (removed bool, err error) {
	err = unix.Unlinkat(l.dirOf(g, i).FD(), pipefile.UnitName(i), 0)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("ledger: remove %s: %w", l.Path(g, i), err)
}

// RemoveFIFO deletes unit i of GPU g's FIFO when it is still want, and says
// whether it did: a FIFO made there since (the unit changed hands) is left.
func (l *Ledger) RemoveFIFO(g, i int, want FileID) (removed bool, err error) {
	dir := l.dirOf(g, i)
	if st, err := dir.Stat(i); err != nil || !pipefile.IsFIFO(&st) || fileID(&st) != want {
		return false, nil
	}
	return l.Remove(g, i)
}

// Present reports whether unit i of GPU g has a FIFO now. Anything else at that
// name (a file, a symlink) does not count.
func (l *Ledger) Present(g, i int) bool {
	st, err := l.dirOf(g, i).Stat(i)
	return err == nil && pipefile.IsFIFO(&st)
}

// Scan lists the units of GPU g that have a FIFO. It looks at the unit names
// only, so its cost does not grow with whatever else users put in the folders.
func (l *Ledger) Scan(g int) ([]int, error) {
	var out []int
	for i := 0; i < l.model.UnitsPerGPU; i++ {
		st, err := l.dirOf(g, i).Stat(i)
		switch {
		case err == nil:
			if pipefile.IsFIFO(&st) {
				out = append(out, i)
			}
		case errors.Is(err, unix.EACCES):
			// A local user's FUSE mount, which root may not look at: no
			// FIFO (Sweep detaches it), and no reason to leave the GPU's
			// other units unlisted.
		case !errors.Is(err, unix.ENOENT):
			return nil, fmt.Errorf("ledger: %s: %w", l.Path(g, i), err)
		}
	}
	return out, nil
}

// Held reports whether unit i of GPU g's FIFO is flock()ed by some process,
// as an offline claim's is and the daemon's own never are.
func (l *Ledger) Held(g, i int) bool { return l.dirOf(g, i).Held(i) }

// FileID names one FIFO: its device and inode. (Not its change time: the
// claim protocol's link and unlink of the temporary name change it after the
// claim is visible.) A FIFO made later at the same name gets another inode
// unless the file system reuses the number at once; should that happen while a
// probe runs, the worst case is a lease's FIFO removed, which the watcher sees
// and recreates.
type FileID struct {
	Dev, Ino uint64
}

func fileID(st *unix.Stat_t) FileID { return FileID{Dev: st.Dev, Ino: st.Ino} }

// Stat returns the owner and identity of unit i of GPU g's FIFO; ok is false
// when there is no FIFO there. The owner is the FIFO's own, never that of
// what a symlink points to: a claim belongs to whoever made the FIFO.
func (l *Ledger) Stat(g, i int) (uid uint32, id FileID, ok bool) {
	st, err := l.dirOf(g, i).Stat(i)
	if err != nil || !pipefile.IsFIFO(&st) {
		return 0, FileID{}, false
	}
	return st.Uid, fileID(&st), true
}

// Probe tells whether the offline claim on unit i of GPU g, the FIFO want, is
// live, that is locked by some process. A claim nobody holds is removed and
// reported as stale; a FIFO other than want (the unit changed hands since want
// was seen) and anything not a FIFO (Sweep's) are left alone. The lock taken
// for the test is held across the removal so that no claimer can take that
// FIFO meanwhile.
func (l *Ledger) Probe(g, i int, want FileID) (stale bool, err error) {
	dir := l.dirOf(g, i)
	fd, st, held, err := dir.TryLock(i)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, pipefile.ErrNotFIFO):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ledger: probe %s: %w", l.Path(g, i), err)
	case held:
		return false, nil
	}
	defer unix.Close(fd)
	if fileID(&st) != want {
		return false, nil
	}
	// Still the same FIFO at the name: only its owner could have replaced it,
	// and a claimer never unlinks a unit name.
	if cur, err := dir.Stat(i); err != nil || fileID(&cur) != want {
		return false, nil
	}
	if err := unix.Unlinkat(dir.FD(), pipefile.UnitName(i), 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("ledger: remove stale %s: %w", l.Path(g, i), err)
	}
	return true, nil
}
