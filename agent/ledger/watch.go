package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// Handler receives what the watch sees. Unit is called with the GPU index and
// unit of every FIFO name that was created (gone false) or removed or renamed
// away (gone true); the handler checks Present where it needs the truth, as
// events may coalesce. Rescan is called when events were
// lost and everything must be listed again. Batch is called after a burst of
// events has been delivered, so that the handler can publish once per burst.
type Handler interface {
	Unit(g, i int, gone bool)
	Rescan()
	Batch()
}

// Watch watches every instance folder until ctx ends. It returns once the
// watches are in place; events are delivered from its own goroutine.
func (l *Ledger) Watch(ctx context.Context, h Handler) error {
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return fmt.Errorf("ledger: watch: %w", err)
	}
	type folder struct{ g, k int }
	dirs := map[string]folder{}
	for _, g := range l.gpus {
		for k := 0; k < l.model.InstancesPerGPU; k++ {
			dir := l.InstanceDir(g.Index, k)
			if err := w.Add(dir); err != nil {
				w.Close()
				return fmt.Errorf("ledger: watch %s: %w", dir, err)
			}
			dirs[dir] = folder{g.Index, k}
		}
	}
	go func() {
		defer w.Close()
		handle := func(ev fsnotify.Event) {
			f, ok := dirs[filepath.Dir(ev.Name)]
			if !ok {
				return
			}
			name := filepath.Base(ev.Name)
			if i, ok := ParseUnitName(name, l.model.UnitsPerGPU); ok && l.model.InstanceOf(i) == f.k {
				h.Unit(f.g, i, ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename))
				return
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil {
					l.classify(f.g, f.k, name, fi.Mode().Type())
				}
			}
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
				// Deliver whatever else is queued before asking for one publish.
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
				h.Batch()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				if errors.Is(err, fsnotify.ErrEventOverflow) {
					l.log.Warn("pipe-file ledger: events lost, listing everything again")
				} else {
					l.log.Error("pipe-file ledger: watch error, listing everything again", "err", err)
				}
				h.Rescan()
				h.Batch()
			}
		}
	}()
	return nil
}
