package profiles

import (
	"time"
)

// This file is what the store keeps and when it writes: room made for a new
// task by the limits' rules, figures dropped past MaxAge, and runs written
// together at most once per WriteEvery.

// expireEvery is how often stale figures are looked for: MaxAge is counted
// in days, so an hour late is nothing.
const expireEvery = time.Hour

// noUID is no user: no task was dropped to make room.
const noUID = ^uint32(0)

// makeRoomLocked makes room for a new task of uid: past uid's own cap (root
// has none) its least recently run task goes; when the table is full, the
// least recently run task of the user who holds the most tasks goes, uid's
// own when no other user holds more than uid. So each user keeps at least an
// equal share of the table, however many tasks others bring in. It returns
// the user whose task went, noUID when none did.
func (s *Store) makeRoomLocked(uid uint32) uint32 {
	evicted := noUID
	if uid != 0 && len(s.measured[uid]) >= MaxTasksPerUID {
		s.evictLocked(uid)
		evicted = uid
	}
	for s.kept >= MaxTasks {
		victim, most := uid, len(s.measured[uid])
		for u, tasks := range s.measured {
			// The lowest uid among equals, so that the choice does not
			// follow the map's order.
			if n := len(tasks); n > most || (n == most && n > len(s.measured[uid]) && u < victim) {
				victim, most = u, n
			}
		}
		s.evictLocked(victim)
		evicted = victim
	}
	return evicted
}

// evictLocked drops uid's least recently run task.
func (s *Store) evictLocked(uid uint32) {
	tasks := s.measured[uid]
	var oldest string
	var at time.Time
	for task, ms := range tasks {
		if last := lastRun(ms); oldest == "" || last.Before(at) || (last.Equal(at) && task < oldest) {
			oldest, at = task, last
		}
	}
	if oldest == "" {
		return
	}
	delete(tasks, oldest)
	s.kept--
	if len(tasks) == 0 {
		delete(s.measured, uid)
	}
}

// lastRun is when a task last ran on any model.
func lastRun(ms models) time.Time {
	var last time.Time
	for _, e := range ms {
		if e.Last.After(last) {
			last = e.Last
		}
	}
	return last
}

// leastRecent is the model of ms that ran least recently.
func leastRecent(ms models) string {
	var oldest string
	for m, e := range ms {
		if oldest == "" || e.Last.Before(ms[oldest].Last) || (e.Last.Equal(ms[oldest].Last) && m < oldest) {
			oldest = m
		}
	}
	return oldest
}

// expireLocked drops the figures no run has moved for MaxAge, and the tasks
// and users left without any; it reports whether it dropped any.
func (s *Store) expireLocked() bool {
	cut := s.now().Add(-MaxAge)
	dropped := false
	for uid, tasks := range s.measured {
		for task, ms := range tasks {
			for m, e := range ms {
				if e.Last.Before(cut) {
					delete(ms, m)
					dropped = true
				}
			}
			if len(ms) == 0 {
				delete(tasks, task)
				s.kept--
			}
		}
		if len(tasks) == 0 {
			delete(s.measured, uid)
		}
	}
	if dropped {
		s.changedLocked()
	}
	return dropped
}

// expire is expireTimer's: it drops stale figures and arms the timer again.
func (s *Store) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.expireLocked() {
		s.publishLocked()
	}
	s.expireTimer.Reset(expireEvery)
}

// changedLocked has the file written within writeEvery of the last write.
func (s *Store) changedLocked() {
	s.dirty = true
	if s.writeTimer != nil || s.closed {
		return
	}
	delay := max(0, s.writeEvery-time.Since(s.lastWrite))
	s.writeTimer = time.AfterFunc(delay, s.flush)
}

// flush is writeTimer's: it writes the file if runs are waiting. A write
// that fails keeps them in memory, says so in the log (once per writeEvery
// at most) and is tried again.
func (s *Store) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeTimer = nil
	if s.closed {
		return
	}
	s.flushLocked()
}

// flushLocked writes the file if runs are waiting.
func (s *Store) flushLocked() {
	if !s.dirty {
		return
	}
	s.dirty = false
	if err := s.writeLocked(); err != nil {
		s.log.Warn("task profiles not written; the measured runs are kept in memory and written again later", "file", s.path, "err", err)
		s.changedLocked()
	}
}

// Close stops the timers and writes what is not written yet; a Record after
// it changes the table but writes nothing.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.expireTimer.Stop()
	if s.writeTimer != nil {
		s.writeTimer.Stop()
		s.writeTimer = nil
	}
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.writeLocked()
}
