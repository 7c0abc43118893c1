package lifecycle

import (
	"errors"
	"reflect"
	"testing"
)

// recorder is a log of what closed, in order.
type recorder []string

func (r *recorder) closer(name string, err error) func() error {
	return func() error {
		*r = append(*r, name)
		return err
	}
}

func (r *recorder) step(name string, err error) Step {
	return func(s *Stack) error {
		if err != nil {
			return err
		}
		s.Push(r.closer(name, nil))
		return nil
	}
}

func TestCloseInReverse(t *testing.T) {
	var got recorder
	var s Stack
	if err := s.Start(got.step("a", nil), got.step("b", nil), func(s *Stack) error {
		s.Push(got.closer("c1", nil))
		s.Push(got.closer("c2", nil))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("closed %v before Close", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if want := (recorder{"c2", "c1", "b", "a"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	if err := s.Close(); err != nil || len(got) != 4 {
		t.Fatalf("a second Close: %v, closed %v", err, got)
	}
}

func TestCloseJoinsErrorsAndClosesAll(t *testing.T) {
	var got recorder
	errA, errC := errors.New("a failed"), errors.New("c failed")
	var told []error
	s := Stack{OnError: func(err error) { told = append(told, err) }}
	s.Push(got.closer("a", errA))
	s.Push(got.closer("b", nil))
	s.Push(got.closer("c", errC))
	err := s.Close()
	if !errors.Is(err, errA) || !errors.Is(err, errC) {
		t.Fatalf("Close: %v, want both errors", err)
	}
	if want := (recorder{"c", "b", "a"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	if want := []error{errC, errA}; !reflect.DeepEqual(told, want) {
		t.Fatalf("OnError told %v, want %v (in the order of closing)", told, want)
	}
}

func TestFailedStartClosesWhatStarted(t *testing.T) {
	var got recorder
	boom := errors.New("boom")
	var s Stack
	ranAfter := false
	err := s.Start(got.step("a", nil), func(s *Stack) error {
		// A step that pushed part of what it started before failing has
		// that part closed too.
		s.Push(got.closer("b-half", nil))
		return boom
	}, func(*Stack) error {
		ranAfter = true
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Start: %v, want %v", err, boom)
	}
	if ranAfter {
		t.Fatal("a step after the failed one ran")
	}
	if want := (recorder{"b-half", "a"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	if err := s.Close(); err != nil || len(got) != 2 {
		t.Fatalf("Close after a failed Start: %v, closed %v", err, got)
	}
}

func TestGoStopsAndWaits(t *testing.T) {
	var s Stack
	stop := make(chan struct{})
	returned := false
	s.Go(func() { close(stop) }, func() {
		<-stop
		returned = true
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waited for fn: its write is seen without a race.
	if !returned {
		t.Fatal("Close returned before the goroutine did")
	}
}

func TestOnce(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	f := Once(func() error { calls++; return boom })
	if err := f(); !errors.Is(err, boom) {
		t.Fatalf("first call: %v", err)
	}
	if err := f(); err != nil {
		t.Fatalf("second call: %v, want nil", err)
	}
	if calls != 1 {
		t.Fatalf("ran %d times", calls)
	}
}
