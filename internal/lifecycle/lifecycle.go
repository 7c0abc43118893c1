// Package lifecycle starts a daemon's parts in order and stops them in
// reverse, as containerd's server keeps its plugins and closes them
// backwards. A part is a start function that pushes on the Stack whatever
// stops what it started; the Stack is then the one record of what runs, so
// that a start that fails half way and a clean stop undo the same things,
// in the same order. It owns the order of stopping, not the parts.
package lifecycle

import (
	"errors"
	"sync"
)

// Step starts one part and pushes on s what stops it, if anything does. A
// step may push several closers (they stop in reverse too) or none.
type Step func(s *Stack) error

// Stack is what has started, stopped last first by Close. Its zero value is
// ready; it is not safe for concurrent use, as start-up and stop are one
// goroutine's.
type Stack struct {
	// OnError, when set, is told each closer's error as it happens, so that
	// it can be logged in order among what the closers log themselves.
	OnError func(error)
	closers []func() error
}

// Start runs the steps in order until one fails. A failed step's error is
// returned once what the steps before it (and it) pushed has been closed.
func (s *Stack) Start(steps ...Step) error {
	for _, step := range steps {
		if err := step(s); err != nil {
			s.Close()
			return err
		}
	}
	return nil
}

// Push records c as the next thing to stop: it runs before everything
// pushed earlier.
func (s *Stack) Push(c func() error) { s.closers = append(s.closers, c) }

// Go runs fn on a goroutine of its own and pushes what stops it: stop, which
// must make fn return, then a wait until it has.
func (s *Stack) Go(stop func(), fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	s.Push(func() error {
		stop()
		<-done
		return nil
	})
}

// Close runs the closers last pushed first, each once, every one of them
// whatever the others return, and returns their errors joined. A second Close
// has nothing left to close.
func (s *Stack) Close() error {
	var errs []error
	for len(s.closers) > 0 {
		last := len(s.closers) - 1
		c := s.closers[last]
		s.closers = s.closers[:last]
		if err := c(); err != nil {
			errs = append(errs, err)
			if s.OnError != nil {
				s.OnError(err)
			}
		}
	}
	return errors.Join(errs...)
}

// Once makes f run at most once, for a part that must stop earlier than
// its place in the stack says on a clean stop, yet be stopped with the rest
// when a later step fails: push it where it started, and again where it
// must stop. Calls after the first return nil.
func Once(f func() error) func() error {
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() { err = f() })
		return err
	}
}
