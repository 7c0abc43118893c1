package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/pipefile"
)

// UnitEvent is a unit's FIFO name created (Gone false), or removed or renamed
// away (Gone true). Events may coalesce: the handler checks Present where it
// needs the truth.
type UnitEvent struct {
	GPU, Unit int
	Gone      bool
}

// Handler receives what the watch sees. Units is called with the unit events
// of one batch, in order, and says whether they changed anything, or were only
// the daemon's own FIFOs coming and going. Rescan is called when events were
// lost and everything must be listed again.
type Handler interface {
	Units(events []UnitEvent) (changed bool)
	Rescan()
}

// settle is how long the watch rests after a batch that changed nothing: the
// daemon's own FIFOs, made and removed by lease churn at two events per
// lease. While it rests it reads nothing, so those events pile up in the
// kernel's queue and arrive with one wakeup and one read, handled under one
// lock, instead of waking the daemon per event. Offline claims change the
// table, so the watch does not rest after them and a claim is seen at once,
// unless it comes within this long of the daemon's own events.
const settle = time.Millisecond

// The events the watch asks for: a name coming or going in an instance
// folder, and an instance folder itself going (seen both in its GPU's folder
// and on its own watch). IN_DONT_FOLLOW and IN_ONLYDIR: a watched path is the
// daemon's own folder, never what a symlink there points to.
const (
	nameEvents    = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM
	selfEvents    = unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	watchFlags    = unix.IN_DONT_FOLLOW | unix.IN_ONLYDIR
	instanceWatch = nameEvents | selfEvents | watchFlags
	gpuWatch      = unix.IN_DELETE | unix.IN_MOVED_FROM | watchFlags
)

// watchBuffer holds what one read takes: over a thousand events of unit
// names, which are short. Events beyond it stay queued for the next read.
const watchBuffer = 64 << 10

// Watch watches every instance folder until ctx ends. It returns once the
// watches are in place; events are delivered from its own goroutine.
//
// It reads inotify itself rather than through fsnotify, whose reader wakes
// for every event and cannot be told to rest: under lease churn those
// wakeups cost the daemon a tenth of its leasing throughput.
//
// The watch costs nothing per name that is no unit name: such events are
// dropped on their name alone, with no look at the file and no record, and
// the watch never logs (it leaves notes that Sweep logs), so a flood of junk
// names in a folder neither delays an offline claim nor waits on the log.
func (l *Ledger) Watch(ctx context.Context, h Handler) error {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("ledger: watch: inotify_init1: %w", err)
	}
	w := &watch{l: l, h: h, fd: fd, instances: map[int32]instanceFolder{}, gpus: map[int32]int{}}
	for _, g := range l.gpus {
		// The GPU's folder too: an instance folder removed or moved away is
		// seen there (the daemon's descriptor keeps the folder itself alive).
		dir := filepath.Join(l.Root(), g.UUID)
		wd, err := unix.InotifyAddWatch(fd, dir, gpuWatch)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("ledger: watch %s: %w", dir, err)
		}
		w.gpus[int32(wd)] = g.Index
		for k := 0; k < l.model.InstancesPerGPU; k++ {
			dir := l.InstanceDir(g.Index, k)
			wd, err := unix.InotifyAddWatch(fd, dir, instanceWatch)
			if err != nil {
				unix.Close(fd)
				return fmt.Errorf("ledger: watch %s: %w", dir, err)
			}
			w.instances[int32(wd)] = instanceFolder{g.Index, k}
		}
	}
	l.watching.Add(1)
	go func() {
		defer l.watching.Done()
		defer unix.Close(fd)
		w.run(ctx)
	}()
	return nil
}

// instanceFolder is the folder of instance k of GPU index g.
type instanceFolder struct{ g, k int }

// watch is one Watch's state, used by its goroutine only.
type watch struct {
	l *Ledger
	h Handler
	// fd is the inotify descriptor, non-blocking and not in Go's poller.
	fd        int
	instances map[int32]instanceFolder
	gpus      map[int32]int
	batch     []UnitEvent
}

func (w *watch) run(ctx context.Context) {
	buf := make([]byte, watchBuffer)
	rest := time.NewTimer(0)
	<-rest.C
	pause := func() bool {
		rest.Reset(settle)
		select {
		case <-ctx.Done():
			return false
		case <-rest.C:
			return true
		}
	}
	for {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			// Nothing queued: wait for something. Under lease churn a rest
			// always ends with events queued, so this wait is for quiet times.
			n, err = w.waitAndRead(ctx, buf)
			if ctx.Err() != nil {
				return
			}
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			msg := err.Error()
			w.l.lastWatchErr.Store(&msg)
			w.l.watchErrs.Add(1)
			w.h.Rescan()
			if !pause() {
				return
			}
			continue
		}
		overflow := w.parse(buf[:n])
		// Rest only after unit events that changed nothing: the daemon's own.
		// Other names (a claimer's temporary FIFO just before its link) are
		// no reason to rest.
		rest := len(w.batch) > 0 && !w.h.Units(w.batch)
		w.batch = w.batch[:0]
		if overflow {
			w.l.lost.Add(1)
			w.h.Rescan()
			continue
		}
		if rest && !pause() {
			return
		}
	}
}

// waitAndRead blocks until inotify has events, or ctx ends, and reads them.
//
// It waits in Go's poller, but on a duplicate of the descriptor that is in the
// poller only for the wait: a descriptor left in the poller's epoll set wakes a
// sleeping thread for every event the kernel queues, even while the watch
// rests and reads nothing, and those wakeups cost leasing under churn a tenth
// of its throughput. Waiting in the poller, rather than in a blocking poll(2),
// lets a claim's event run the watch as soon as a thread looks for work, where
// a thread back from a long syscall would queue for one behind busy ones.
func (w *watch) waitAndRead(ctx context.Context, buf []byte) (int, error) {
	dup, err := unix.FcntlInt(uintptr(w.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("duplicating the inotify descriptor: %w", err)
	}
	// Non-blocking, as the descriptor it shares its file with: os.NewFile
	// puts it in the poller.
	f := os.NewFile(uintptr(dup), "inotify")
	defer f.Close()
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	return f.Read(buf)
}

// parse adds the unit events of b, whole inotify events as one read returns
// them, to the batch, and marks instance folders that went. It reports
// whether the kernel's queue overflowed (events were lost).
func (w *watch) parse(b []byte) (overflow bool) {
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
		if size > len(b) {
			// The kernel returns whole events only.
			break
		}
		name := b[unix.SizeofInotifyEvent:size]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		b = b[size:]
		if mask&unix.IN_Q_OVERFLOW != 0 {
			overflow = true
			continue
		}
		if f, ok := w.instances[wd]; ok {
			w.instanceEvent(f, mask, name)
		} else if g, ok := w.gpus[wd]; ok && mask&unix.IN_ISDIR != 0 {
			// A folder of GPU g removed or moved away: an instance folder, if
			// its name is an instance's.
			if k, err := strconv.Atoi(string(name)); err == nil && k >= 0 && k < w.l.model.InstancesPerGPU && string(name) == strconv.Itoa(k) {
				w.gone(instanceFolder{g, k})
			}
		}
	}
	return overflow
}

func (w *watch) instanceEvent(f instanceFolder, mask uint32, name []byte) {
	if mask&selfEvents != 0 {
		w.gone(f)
		return
	}
	i, ok := pipefile.ParseUnitName(string(name), w.l.model.UnitsPerGPU)
	if !ok || w.l.model.InstanceOf(i) != f.k {
		// Any other name is no claim: ignored, at no cost.
		return
	}
	// Only a name coming or going changes what is claimed: a claimer's
	// link(2) and unlink(2) of its temporary name also touch the unit's
	// inode, which is not asked for, and opening it writes nothing that
	// counts.
	switch {
	case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
		w.batch = append(w.batch, UnitEvent{GPU: f.g, Unit: i, Gone: true})
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		w.batch = append(w.batch, UnitEvent{GPU: f.g, Unit: i})
	}
}

// gone marks an instance folder removed or moved away: the watch and the
// daemon's descriptor stay with the old folder, so claims in a new one at
// that path go unseen. Sweep says so.
func (w *watch) gone(f instanceFolder) {
	w.l.folderGone[f.g*w.l.model.InstancesPerGPU+f.k].Store(true)
}
