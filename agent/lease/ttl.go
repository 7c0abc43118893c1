package lease

import (
	"container/heap"
	"time"

	"github.com/gpulet/gpulet/internal/clock"
)

// ttlBinding ends a lease unless it is renewed within ttl.
type ttlBinding struct {
	ttl      time.Duration
	deadline time.Time
	// id is the lease's; queue is the expiry queue it is in, and index its
	// place there (-1: in none).
	id    string
	queue *expiryQueue
	index int
}

func newTTLBinding(ttl time.Duration, deadline time.Time) *ttlBinding {
	return &ttlBinding{ttl: ttl, deadline: deadline, index: -1}
}

func (b *ttlBinding) kind() Kind { return KindTTL }

// armLocked puts the lease in the expiry queue, or moves it to its new
// deadline after a renewal.
func (b *ttlBinding) armLocked(m *Manager, l *lease) {
	b.id = l.ID
	q := &m.expiries
	if b.index < 0 {
		b.queue = q
		heap.Push(q, b)
	} else {
		heap.Fix(q, b.index)
	}
	m.expiries.armLocked()
}

// release takes the lease out of its expiry queue. Like any binding's once
// it was armed, it is called under the Manager's lock.
func (b *ttlBinding) release() {
	if b.queue != nil && b.index >= 0 {
		heap.Remove(b.queue, b.index)
	}
}

// expiryQueue holds the ttl leases by deadline, soonest first, under one
// timer set for the soonest: a timer a lease would cost more memory than the
// rest of the lease. The Manager's lock guards it.
type expiryQueue struct {
	// t is the table whose leases expire.
	t      *Manager
	leases []*ttlBinding
	// timer, when set, fires at at; gen numbers the timers set, so that one
	// that fired as it was replaced does nothing.
	timer clock.Timer
	at    time.Time
	gen   uint64
}

func (q *expiryQueue) Len() int { return len(q.leases) }

func (q *expiryQueue) Less(i, j int) bool { return q.leases[i].deadline.Before(q.leases[j].deadline) }

func (q *expiryQueue) Swap(i, j int) {
	q.leases[i], q.leases[j] = q.leases[j], q.leases[i]
	q.leases[i].index, q.leases[j].index = i, j
}

func (q *expiryQueue) Push(x any) {
	b := x.(*ttlBinding)
	b.index = len(q.leases)
	q.leases = append(q.leases, b)
}

func (q *expiryQueue) Pop() any {
	n := len(q.leases) - 1
	b := q.leases[n]
	q.leases[n] = nil
	q.leases = q.leases[:n]
	b.index = -1
	return b
}

// armLocked sets the timer for the soonest deadline, unless it is set
// for that or sooner already. A timer that fires early (its lease was
// renewed or released) finds nothing due and sets the next.
func (q *expiryQueue) armLocked() {
	if len(q.leases) == 0 {
		return
	}
	next := q.leases[0].deadline
	if q.timer != nil && !q.at.After(next) {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
	}
	q.gen++
	gen := q.gen
	q.at = next
	q.timer = q.t.clock.AfterFunc(next.Sub(q.t.clock.Now()), func() { q.expireDue(gen) })
}

// expireDue ends the leases whose deadline has passed, when timer gen fires,
// and sets the timer for the next. A wall clock stepped back since the
// timer was set leaves them to a later timer.
func (q *expiryQueue) expireDue(gen uint64) {
	if !q.t.lockOpen() {
		return
	}
	defer q.t.unlock()
	if gen != q.gen {
		return
	}
	q.timer = nil
	now := q.t.clock.Now()
	for len(q.leases) > 0 && !now.Before(q.leases[0].deadline) {
		b := heap.Pop(q).(*ttlBinding)
		if l, ok := q.t.leases[b.id]; ok && l.bind == b {
			q.t.dropAndRecordLocked(l, "ttl expired", true)
		}
	}
	q.armLocked()
}

// stopLocked stops the timer: a closed Manager ends nothing.
func (q *expiryQueue) stopLocked() {
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
}
