package lease

import (
	"sync"

	"github.com/gpulet/gpulet/internal/errdefs"
)

// uidCap counts what each uid has under way (requests queued for units), so
// that one user cannot queue without bound and starve the others or the
// daemon's memory. Root is not capped: it is trusted, and a scheduler running
// as root may queue for many jobs. Its zero value is ready to use.
type uidCap struct {
	mu sync.Mutex // guards n
	n  map[uint32]int
}

// take counts one more for uid, or refuses with errdefs.ErrTooMany when uid
// has max under way already (max 0: no cap). Call release once the thing
// counted is over.
func (c *uidCap) take(uid uint32, max int) (release func(), err error) {
	if uid == 0 || max <= 0 {
		return func() {}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[uid] >= max {
		return nil, errdefs.Errorf(errdefs.ErrTooMany, "wait: uid %d already has %d requests waiting for units, the most one user may (--max-waiters-per-uid); retry when one has ended", uid, max)
	}
	if c.n == nil {
		c.n = map[uint32]int{}
	}
	c.n[uid]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[uid]--; c.n[uid] == 0 {
				delete(c.n, uid)
			}
		})
	}, nil
}

// count is what uid has under way.
func (c *uidCap) count(uid uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[uid]
}
