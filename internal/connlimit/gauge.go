// Package connlimit keeps a network listener from running its process out
// of file descriptors: a Gauge estimates the descriptors open, and a TCP
// listener closes at once the connections past its caps or past the
// descriptors it must leave free. gpuletd wraps its --listen port with it
// (sharing the gauge with its Unix socket's listener), gpulet-collector
// its port.
package connlimit

import (
	"sync"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/internal/procfs"
)

// Counting the open descriptors reads /proc/self/fd, about a microsecond a
// descriptor: too dear for every accept when thousands are open, since a
// caller decides how often it connects. So a count is reused for a while,
// moved by the connections accepted and closed since, which are what
// callers change; the reserve covers what the process itself opens
// meanwhile.
const (
	countEvery = 250 * time.Millisecond
	// countNear is how often to count when the estimate is within twice
	// the reserve of the limit.
	countNear = 20 * time.Millisecond
)

// Gauge estimates the process's open descriptors for the listeners that
// share it, each of which keeps its own reserve free: the connections of
// all of them move one estimate, so that none is blind to what the others
// hold.
type Gauge struct {
	// Usage returns the open descriptors and the soft limit on them
	// (FDUsage). Usage, CountEvery and CountNear may be changed before the
	// gauge is first used; tests do.
	Usage func() (open int, limit uint64, err error)
	// CountEvery is how long a count is reused; CountNear how long when
	// the estimate is within twice the reserve of the limit.
	CountEvery, CountNear time.Duration

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

// NewGauge returns a gauge that counts the descriptors with FDUsage.
func NewGauge() *Gauge {
	return &Gauge{Usage: FDUsage, CountEvery: countEvery, CountNear: countNear}
}

// Add counts n more open connections (n < 0: closed).
func (g *Gauge) Add(n int) {
	g.mu.Lock()
	g.conns += n
	g.mu.Unlock()
}

// Left reports whether more than reserveOf(limit) descriptors are free, a
// connection just accepted (open, not yet counted by Add) included, and the
// figures it judged by.
func (g *Gauge) Left(reserveOf func(limit uint64) uint64) (ok bool, open int, limit, reserve uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	open = g.countedOpen + (g.conns + 1 - g.countedConns)
	reserve = reserveOf(g.countedLimit)
	age := time.Since(g.counted)
	if g.counted.IsZero() || age >= g.CountEvery || (uint64(open)+2*reserve > g.countedLimit && age >= g.CountNear) {
		n, lim, err := g.Usage()
		if err != nil {
			return false, 0, 0, 0, err
		}
		g.counted, g.countedOpen, g.countedLimit, g.countedConns = time.Now(), n-1, lim, g.conns
		open, reserve = n, reserveOf(lim)
	}
	return uint64(open)+reserve <= g.countedLimit, open, g.countedLimit, reserve, nil
}

// FDUsage counts this process's open file descriptors and reads the soft
// limit on them.
func FDUsage() (int, uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	n, err := procfs.OpenDescriptors()
	return n, lim.Cur, err
}
