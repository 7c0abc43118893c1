// Package logwriter writes a daemon's log lines from a goroutine of its own, a
// batch per write(2). A request that logs does not wait for the log's reader
// (journald or a pipe) to be woken, and under load many lines share one write
// and one wakeup of that reader. What is queued when the process dies
// abruptly is lost: usually about a millisecond's worth, up to the queue's
// bound when the reader stalls. FlushingHandler writes warnings and errors out
// before returning, so that the lines leading to a crash are not among them.
package logwriter

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// rest is how long the writer waits after a write before taking the next
// batch: under load the lines of many requests then share one write, and the
// log's reader is woken at most once per rest. A line of an idle daemon is
// written at once.
const rest = time.Millisecond

// maxPending is how much may wait to be written before Write blocks: a stalled
// reader slows the daemon down rather than growing its memory or losing lines.
const maxPending = 1 << 20

// Writer is an io.Writer that queues and writes in the background. Lines are
// written in order. Close writes what is queued and stops the goroutine.
type Writer struct {
	out io.Writer

	mu      sync.Mutex
	cond    *sync.Cond // signalled when the queue is taken, filled, written or closed
	pending []byte
	// queued and written count the bytes ever queued and ever written out.
	queued, written uint64
	closed          bool
	stopped         bool // the background goroutine has written all and returned
	done            chan struct{}
}

// New starts a Writer in front of out.
func New(out io.Writer) *Writer {
	w := &Writer{out: out, done: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	go w.flush()
	return w
}

// Write queues p. It blocks only while more than maxPending bytes wait. After
// Close it writes p directly, once everything queued before is out.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	for len(w.pending) >= maxPending && !w.closed {
		w.cond.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return w.out.Write(p)
	}
	w.pending = append(w.pending, p...)
	w.queued += uint64(len(p))
	w.cond.Broadcast()
	w.mu.Unlock()
	return len(p), nil
}

func (w *Writer) flush() {
	defer close(w.done)
	var batch []byte
	w.mu.Lock()
	for {
		for len(w.pending) == 0 && !w.closed {
			w.cond.Wait()
		}
		if len(w.pending) == 0 {
			w.stopped = true
			w.cond.Broadcast()
			w.mu.Unlock()
			return
		}
		// Swap buffers, so that neither side allocates in the steady state.
		batch, w.pending = w.pending, batch[:0]
		w.cond.Broadcast()
		w.mu.Unlock()
		// A failed write has nowhere to be reported: the log is where errors go.
		w.out.Write(batch)
		w.mu.Lock()
		w.written += uint64(len(batch))
		w.cond.Broadcast()
		w.mu.Unlock()
		time.Sleep(rest)
		w.mu.Lock()
	}
}

// Flush waits until everything written to w before it is out.
func (w *Writer) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for target := w.queued; w.written < target && !w.stopped; {
		w.cond.Wait()
	}
}

// Close writes what is queued and stops the background goroutine. Later
// writes go straight to the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.done
	return nil
}

// FlushingHandler wraps h, which writes to w, so that records at level or
// above are written out before Handle returns.
func FlushingHandler(h slog.Handler, w *Writer, level slog.Leveler) slog.Handler {
	return flushingHandler{Handler: h, w: w, level: level}
}

type flushingHandler struct {
	slog.Handler
	w     *Writer
	level slog.Leveler
}

func (h flushingHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= h.level.Level() {
		h.w.Flush()
	}
	return err
}

func (h flushingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushingHandler{Handler: h.Handler.WithAttrs(attrs), w: h.w, level: h.level}
}

func (h flushingHandler) WithGroup(name string) slog.Handler {
	return flushingHandler{Handler: h.Handler.WithGroup(name), w: h.w, level: h.level}
}
