package ledger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

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
// lease. Resting lets them pile up and arrive as one batch, handled under one
// lock, instead of waking the handler per event. Offline claims change the
// table, so the watch does not rest after them and a claim is seen at once,
// unless it comes within this long of the daemon's own events.
const settle = time.Millisecond

// Watch watches every instance folder until ctx ends. It returns once the
// watches are in place; events are delivered from its own goroutine.
//
// The watch costs nothing per name that is no unit name: such events are
// dropped on their name alone, with no look at the file and no record, and
// the watch never logs (it leaves notes that Sweep logs), so a flood of junk
// names in a folder neither delays an offline claim nor waits on the log.
func (l *Ledger) Watch(ctx context.Context, h Handler) error {
	// The buffer takes what arrives while the handler rests, so that the
	// kernel's queue does not overflow in a burst.
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return fmt.Errorf("ledger: watch: %w", err)
	}
	type folder struct{ g, k, idx int }
	dirs := map[string]folder{}
	for _, g := range l.gpus {
		// The GPU's folder too: an instance folder removed or moved away is
		// seen there (the daemon's descriptor keeps the folder itself alive).
		watched := []string{filepath.Join(l.Root(), g.UUID)}
		for k := 0; k < l.model.InstancesPerGPU; k++ {
			dir := l.InstanceDir(g.Index, k)
			watched = append(watched, dir)
			dirs[dir] = folder{g.Index, k, g.Index*l.model.InstancesPerGPU + k}
		}
		for _, dir := range watched {
			if err := w.Add(dir); err != nil {
				w.Close()
				return fmt.Errorf("ledger: watch %s: %w", dir, err)
			}
		}
	}
	go func() {
		defer w.Close()
		rest := time.NewTimer(0)
		<-rest.C
		var batch []UnitEvent
		handle := func(ev fsnotify.Event) {
			if f, instance := dirs[ev.Name]; instance && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
				// The watch and the daemon's descriptor stay with the old
				// folder: claims in a new one at that path go unseen.
				l.folderGone[f.idx].Store(true)
				return
			}
			f, ok := dirs[filepath.Dir(ev.Name)]
			if !ok {
				return
			}
			name := filepath.Base(ev.Name)
			if i, ok := pipefile.ParseUnitName(name, l.model.UnitsPerGPU); ok && l.model.InstanceOf(i) == f.k {
				// Only a name coming or going changes what is claimed: a
				// claimer's link(2) and unlink(2) of its temporary name also
				// touch the unit's inode (IN_ATTRIB), and opening it writes
				// nothing that counts.
				gone := ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)
				if gone || ev.Has(fsnotify.Create) {
					batch = append(batch, UnitEvent{GPU: f.g, Unit: i, Gone: gone})
				}
			}
			// Any other name is no claim: ignored, at no cost.
		}
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				handle(ev)
				// Take whatever else is queued, to deliver it as one batch.
			drain:
				for {
					select {
					case ev, ok := <-w.Events:
						if !ok {
							break drain
						}
						handle(ev)
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					continue
				}
				changed := h.Units(batch)
				batch = batch[:0]
				if changed {
					continue
				}
				rest.Reset(settle)
				select {
				case <-ctx.Done():
					return
				case <-rest.C:
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				if errors.Is(err, fsnotify.ErrEventOverflow) {
					l.lost.Add(1)
				} else {
					msg := err.Error()
					l.lastWatchErr.Store(&msg)
					l.watchErrs.Add(1)
				}
				h.Rescan()
			}
		}
	}()
	return nil
}
