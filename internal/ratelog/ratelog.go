// Package ratelog bounds the log lines that callers outside the daemon can
// cause: a local user who floods the ledger with junk names or the API with bad
// requests must not flood the log, fill the disk under it, or slow the daemon
// down with logging. A Limiter lets a number of lines a second through and
// counts the rest; the next line let through after a full second, or Flush,
// says how many were left out.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter lets at most PerSecond lines a second through to its logger.
type Limiter struct {
	log       *slog.Logger
	what      string
	perSecond int
	now       func() time.Time

	mu      sync.Mutex // guards window, used, skipped and flushing
	window  time.Time  // start of the current second
	used    int
	skipped int
	// flushing is set while a timer is armed to report the lines left out
	// once their second is over, should no line come to report them.
	flushing bool
}

// New makes a Limiter of perSecond lines a second for the lines of one kind,
// named by what in the line that reports lines left out. now may be nil.
func New(log *slog.Logger, what string, perSecond int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{log: log, what: what, perSecond: perSecond, now: now}
}

// Log writes the line when the budget allows, and counts it otherwise. It
// reports whether the line was written.
func (l *Limiter) Log(level slog.Level, msg string, args ...any) bool {
	l.mu.Lock()
	left := l.rollLocked()
	ok := l.used < l.perSecond
	if ok {
		l.used++
	} else {
		l.skipped++
		if !l.flushing {
			l.flushing = true
			time.AfterFunc(time.Second, l.flushLater)
		}
	}
	l.mu.Unlock()
	l.reportLeftOut(left)
	if ok {
		l.log.Log(context.Background(), level, msg, args...)
	}
	return ok
}

// Flush says how many lines the last full second left out, if any. A Limiter
// also does so by itself a second after it first leaves a line out, so that a
// burst's count is not held back until the next line; Flush is for callers
// with a tick of their own.
func (l *Limiter) Flush() {
	l.mu.Lock()
	left := l.rollLocked()
	l.mu.Unlock()
	l.reportLeftOut(left)
}

// flushLater reports what a second left out when no later line did.
func (l *Limiter) flushLater() {
	l.mu.Lock()
	l.flushing = false
	l.mu.Unlock()
	l.Flush()
}

type leftOut struct {
	n     int
	since time.Time
}

// rollLocked starts a new second once the current one is over and returns
// what the one that ended left out.
func (l *Limiter) rollLocked() leftOut {
	now := l.now()
	if d := now.Sub(l.window); d >= 0 && d < time.Second {
		return leftOut{}
	}
	out := leftOut{n: l.skipped, since: l.window}
	l.window, l.used, l.skipped = now, 0, 0
	return out
}

func (l *Limiter) reportLeftOut(o leftOut) {
	if o.n == 0 {
		return
	}
	l.log.Warn("log lines left out: more than the budget a second", "what", l.what, "left_out", o.n, "budget", l.perSecond, "since", o.since)
}
