// Package ledger is the pipe-file ledger of DESIGN section 5: one FIFO per unit
// in use at <run-dir>/units/<gpu-uuid>/<instance>/unit-<i>. It creates the
// folders and layout.json, makes and removes the daemon's own FIFOs, lists and
// watches what is there, and probes offline claims for staleness. It keeps no
// record of who holds what: that is the lease manager's.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/units"
)

// UnitPrefix starts every unit FIFO's name.
const UnitPrefix = "unit-"

// LayoutFile is the name of the layout under <run-dir>/units.
const LayoutFile = "layout.json"

// ParseUnitName returns i for a name "unit-<i>" with 0 ≤ i < total. Leading
// zeros, signs and spaces are refused so that one unit has exactly one name.
func ParseUnitName(name string, total int) (int, bool) {
	digits, ok := strings.CutPrefix(name, UnitPrefix)
	if !ok || digits == "" || len(digits) > 9 {
		return 0, false
	}
	if digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i >= total {
		return 0, false
	}
	return i, true
}

// UnitName is the FIFO name of unit i.
func UnitName(i int) string { return UnitPrefix + strconv.Itoa(i) }

// GPU is what the ledger needs of a GPU.
type GPU struct {
	Index int
	UUID  string
	Name  string
}

// Layout is layout.json: what an offline claimer reads to know which names it
// may take and the environment its process runs with.
type Layout struct {
	Schema string      `json:"schema"`
	GPUs   []LayoutGPU `json:"gpus"`
}

// LayoutSchema names the layout format.
const LayoutSchema = "gpulet.layout/v1"

// LayoutGPU is one GPU of layout.json.
type LayoutGPU struct {
	Index      int              `json:"index"`
	UUID       string           `json:"uuid"`
	Name       string           `json:"name"`
	UnitsTotal int              `json:"units_total"`
	Instances  []LayoutInstance `json:"instances"`
}

// LayoutInstance is one MPS instance of layout.json.
type LayoutInstance struct {
	Instance int               `json:"instance"`
	Units    []int             `json:"units"`
	Env      map[string]string `json:"env"`
}

// Ledger is the pipe-file folder tree of one daemon.
type Ledger struct {
	root  string // <run-dir>/units
	model units.Model
	gpus  []GPU
	log   *slog.Logger
	// dirs holds, by GPU index and instance, a descriptor of the instance
	// folder, opened once: FIFOs are made, removed and looked at relative to
	// it, without building and walking their path on every lease.
	dirs [][]int

	mu sync.Mutex // guards reported
	// reported holds the paths of foreign entries already logged, so that each
	// is logged once.
	reported map[string]bool
}

// New prepares the ledger under runDir: it creates units/<uuid>/<k>/ for every
// GPU and instance. Instance folders are world-writable and sticky, like /tmp, so
// that any user may claim offline while only the owner of a FIFO (and the daemon)
// can remove it.
func New(runDir string, model units.Model, gpus []GPU, log *slog.Logger) (*Ledger, error) {
	l := &Ledger{root: filepath.Join(runDir, "units"), model: model, gpus: gpus, log: log, reported: map[string]bool{}}
	if err := mkdirNoSymlink(l.root, 0o755); err != nil {
		return nil, err
	}
	l.dirs = make([][]int, len(gpus))
	for _, g := range gpus {
		if err := mkdirNoSymlink(filepath.Join(l.root, g.UUID), 0o755); err != nil {
			l.Close()
			return nil, err
		}
		for k := 0; k < model.InstancesPerGPU; k++ {
			dir := l.InstanceDir(g.Index, k)
			if err := mkdirNoSymlink(dir, 0o755); err != nil {
				l.Close()
				return nil, err
			}
			if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
				l.Close()
				return nil, fmt.Errorf("ledger: %w", err)
			}
			fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("ledger: open %s: %w", dir, err)
			}
			l.dirs[g.Index] = append(l.dirs[g.Index], fd)
		}
	}
	return l, nil
}

// Close releases the instance folders' descriptors.
func (l *Ledger) Close() error {
	for _, fds := range l.dirs {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	l.dirs = nil
	return nil
}

// dirOf is the descriptor of the folder that holds unit i of GPU g.
func (l *Ledger) dirOf(g, i int) int { return l.dirs[g][l.model.InstanceOf(i)] }

// mkdirNoSymlink makes dir if missing and refuses one that is a symlink or not a
// directory, so that the daemon never writes through a link planted in its tree.
func mkdirNoSymlink(dir string, mode os.FileMode) error {
	if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("ledger: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("ledger: %s is not a directory (%s)", dir, fi.Mode().Type())
	}
	return nil
}

// Root is <run-dir>/units.
func (l *Ledger) Root() string { return l.root }

// InstanceDir is the folder of instance k of GPU index g.
func (l *Ledger) InstanceDir(g, k int) string {
	return filepath.Join(l.root, l.gpus[g].UUID, strconv.Itoa(k))
}

// Path is the FIFO path of unit i of GPU index g.
func (l *Ledger) Path(g, i int) string {
	return filepath.Join(l.InstanceDir(g, l.model.InstanceOf(i)), UnitName(i))
}

// WriteLayout writes layout.json atomically (temp file and rename), readable by
// everyone. env gives the environment of instance k of GPU index g.
func (l *Ledger) WriteLayout(env func(g, k int) map[string]string) error {
	lay := Layout{Schema: LayoutSchema}
	for _, g := range l.gpus {
		lg := LayoutGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, UnitsTotal: l.model.UnitsPerGPU}
		for k := 0; k < l.model.InstancesPerGPU; k++ {
			lg.Instances = append(lg.Instances, LayoutInstance{Instance: k, Units: l.model.InstanceUnits(k), Env: env(g.Index, k)})
		}
		lay.GPUs = append(lay.GPUs, lg)
	}
	b, err := json.MarshalIndent(lay, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	path := filepath.Join(l.root, LayoutFile)
	// Written only when it changes: a restart on a full run dir must not
	// fail for want of room to write what is already there.
	if old, err := os.ReadFile(path); err == nil && string(old) == string(b) {
		return nil
	}
	return WriteFileAtomic(path, b, 0o644)
}

// WriteFileAtomic writes data to a temporary file beside path and renames it
// over path, so that readers see the old or the new content, never a part.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp, mode)); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// ErrTaken is returned by Create when the unit's FIFO exists already.
var ErrTaken = errors.New("unit taken")

// Create makes the FIFO of unit i of GPU g for a lease. ErrTaken means someone
// (an offline claimer) made it first.
func (l *Ledger) Create(g, i int) error {
	err := unix.Mknodat(l.dirOf(g, i), UnitName(i), unix.S_IFIFO|0o600, 0)
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
	err = unix.Unlinkat(l.dirOf(g, i), UnitName(i), 0)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("ledger: remove %s: %w", l.Path(g, i), err)
}

// Present reports whether unit i of GPU g has a FIFO now. Anything else at that
// name (a file, a symlink) does not count.
func (l *Ledger) Present(g, i int) bool {
	var st unix.Stat_t
	if err := unix.Fstatat(l.dirOf(g, i), UnitName(i), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFIFO
}

// Scan lists the units of GPU g that have a FIFO, logging foreign entries once.
func (l *Ledger) Scan(g int) ([]int, error) {
	var out []int
	for k := 0; k < l.model.InstancesPerGPU; k++ {
		dir := l.InstanceDir(g, k)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		for _, e := range ents {
			i, ok := l.classify(g, k, e.Name(), e.Type())
			if ok {
				out = append(out, i)
			}
		}
	}
	return out, nil
}

// Classify says whether name in instance folder k of GPU g is a unit FIFO, and
// which unit. typ is the entry's type as the directory listing gave it; pass
// ^os.FileMode(0) to have it looked up.
func (l *Ledger) classify(g, k int, name string, typ os.FileMode) (int, bool) {
	// Temporary names of the claim protocol start with a dot; they are not
	// foreign, only not yet claims.
	if strings.HasPrefix(name, ".") {
		return 0, false
	}
	i, ok := ParseUnitName(name, l.model.UnitsPerGPU)
	if ok && l.model.InstanceOf(i) != k {
		ok = false
	}
	if ok && typ&os.ModeNamedPipe == 0 {
		ok = false
	}
	if !ok {
		l.reportOnce(filepath.Join(l.InstanceDir(g, k), name), typ)
	}
	return i, ok
}

func (l *Ledger) reportOnce(path string, typ os.FileMode) {
	l.mu.Lock()
	seen := l.reported[path]
	l.reported[path] = true
	l.mu.Unlock()
	if !seen {
		l.log.Warn("ignoring entry in the pipe-file ledger: not a FIFO named unit-<i> of this instance", "path", path, "type", typ.String())
	}
}

// Held reports whether unit i of GPU g's FIFO is flock()ed by some process,
// as an offline claim's is and the daemon's own never are.
func (l *Ledger) Held(g, i int) bool {
	fd, err := unix.Open(l.Path(g, i), unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return errors.Is(unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
}

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
// when there is no FIFO there.
func (l *Ledger) Stat(g, i int) (uid uint32, id FileID, ok bool) {
	var st unix.Stat_t
	if err := unix.Lstat(l.Path(g, i), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return 0, FileID{}, false
	}
	return st.Uid, fileID(&st), true
}

// Probe tells whether the offline claim on unit i of GPU g, the FIFO want, is
// live, that is locked by some process. A claim nobody holds is removed and
// reported as stale; a FIFO other than want (the unit changed hands since want
// was seen) is left alone. The lock taken for the test is held across the
// removal so that no claimer can take that FIFO meanwhile.
func (l *Ledger) Probe(g, i int, want FileID) (stale bool, err error) {
	path := l.Path(g, i)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger: probe %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO || fileID(&st) != want {
		return false, nil
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("ledger: probe %s: %w", path, err)
	}
	// Still the same FIFO at the name: only its owner could have replaced it,
	// and a claimer never unlinks a unit name.
	var cur unix.Stat_t
	if err := unix.Lstat(path, &cur); err != nil || fileID(&cur) != want {
		return false, nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("ledger: remove stale %s: %w", path, err)
	}
	return true, nil
}
