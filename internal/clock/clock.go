// Package clock is the time the daemon's timers run on: the real one in
// production, a Fake that tests move by hand, so that a test of a ttl or a
// grace period waits on nothing.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and runs functions after a while.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not happened yet and reports whether
	// it did so.
	Stop() bool
}

// Real is the system clock.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Fake is a clock that moves only when told. Its timers fire, each in its own
// goroutine, when Advance or Set moves the time past their deadline.
type Fake struct {
	mu     sync.Mutex // guards now and timers
	now    time.Time
	timers []*fakeTimer
}

// NewFake makes a Fake clock showing t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now is the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to run once the fake time reaches Now()+d.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the time forward by d and fires the timers it passes.
func (c *Fake) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the time to t (backwards too, as a wall clock may step) and fires
// the timers whose deadline is not after t, in deadline order.
func (c *Fake) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	var due, left []*fakeTimer
	for _, tm := range c.timers {
		if !tm.at.After(t) {
			due = append(due, tm)
		} else {
			left = append(left, tm)
		}
	}
	c.timers = left
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, tm := range due {
		go tm.f()
	}
}

// Pending is the number of timers not yet fired or stopped.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

type fakeTimer struct {
	clock *Fake
	at    time.Time
	f     func()
}

func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, tm := range c.timers {
		if tm == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}
