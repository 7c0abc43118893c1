package server

import (
	"sync"
	"time"
)

// Counting the open descriptors reads /proc/self/fd, about a microsecond a
// descriptor: too dear for every accept when thousands are open, since a
// caller decides how often it connects. So a count is reused for a while,
// moved by the connections accepted and closed since, which are what
// callers change; the reserve covers what the daemon itself opens meanwhile.
const (
	fdCountEvery = 250 * time.Millisecond
	// fdCountNear is how often to count when the estimate is within twice
	// the reserve of the limit.
	fdCountNear = 20 * time.Millisecond
)

// fdGauge estimates the daemon's open descriptors for the listeners that
// share it (the Unix socket's and --listen's), each of which keeps its own
// reserve free: the connections of both move one estimate, so that neither
// is blind to what the other holds.
type fdGauge struct {
	// fdUsage returns the open descriptors and the soft limit on them.
	fdUsage               func() (open int, limit uint64, err error)
	now                   func() time.Time
	countEvery, countNear time.Duration

	mu sync.Mutex // guards what follows
	// conns counts the connections open through every listener sharing the
	// gauge; counted is when the descriptors were last counted, countedOpen
	// and countedLimit what was found, countedConns conns at that time.
	conns        int
	counted      time.Time
	countedOpen  int
	countedLimit uint64
	countedConns int
}

func newFDGauge() *fdGauge {
	return &fdGauge{fdUsage: fdUsage, now: time.Now, countEvery: fdCountEvery, countNear: fdCountNear}
}

// add counts n more open connections (n < 0: closed).
func (g *fdGauge) add(n int) {
	g.mu.Lock()
	g.conns += n
	g.mu.Unlock()
}

// left reports whether more than reserveOf(limit) descriptors are free, a
// connection just accepted (open, not yet counted by add) included, and the
// figures it judged by.
func (g *fdGauge) left(reserveOf func(limit uint64) uint64) (ok bool, open int, limit, reserve uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	open = g.countedOpen + (g.conns + 1 - g.countedConns)
	reserve = reserveOf(g.countedLimit)
	age := g.now().Sub(g.counted)
	if g.counted.IsZero() || age >= g.countEvery || (uint64(open)+2*reserve > g.countedLimit && age >= g.countNear) {
		n, lim, err := g.fdUsage()
		if err != nil {
			return false, 0, 0, 0, err
		}
		g.counted, g.countedOpen, g.countedLimit, g.countedConns = g.now(), n-1, lim, g.conns
		open, reserve = n, reserveOf(lim)
	}
	return uint64(open)+reserve <= g.countedLimit, open, g.countedLimit, reserve, nil
}
