package clock

import (
	"testing"
	"time"
)

func TestFakeFiresOnlyWhenMovedPastTheDeadline(t *testing.T) {
	c := NewFake(time.Unix(100, 0))
	fired := make(chan string, 3)
	c.AfterFunc(time.Second, func() { fired <- "a" })
	stopped := c.AfterFunc(2*time.Second, func() { fired <- "stopped" })
	c.AfterFunc(3*time.Second, func() { fired <- "c" })
	c.Advance(999 * time.Millisecond)
	select {
	case f := <-fired:
		t.Fatalf("%s fired early", f)
	case <-time.After(20 * time.Millisecond):
	}
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should report true once")
	}
	c.Advance(time.Millisecond)
	if f := <-fired; f != "a" {
		t.Fatalf("fired %s, want a", f)
	}
	if c.Pending() != 1 {
		t.Fatalf("%d pending, want 1", c.Pending())
	}
	c.Set(time.Unix(200, 0))
	if f := <-fired; f != "c" {
		t.Fatalf("fired %s, want c", f)
	}
	if !c.Now().Equal(time.Unix(200, 0)) {
		t.Fatalf("now %v", c.Now())
	}
}

func TestRealClock(t *testing.T) {
	done := make(chan struct{})
	var r Real
	r.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
	if r.Now().IsZero() {
		t.Fatal("zero time")
	}
}
