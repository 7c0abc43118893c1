package snapshot

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// Every Load that begins after a change and its Invalidate must see that
// change, however many writers and readers race; and without a change in
// between, Load builds nothing.
func TestStoreLoadSeesEveryCompletedChange(t *testing.T) {
	var state atomic.Uint64 // the "table": only ever grows
	var builds atomic.Int64
	var s Store
	s.SetBuilder(func() *Published {
		builds.Add(1)
		return New(&api.Snapshot{Seq: state.Load()}, nil, nil)
	})
	if p := s.Load(); p != nil {
		t.Fatalf("Load before any change built %+v", p.Snapshot)
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				mine := state.Add(1)
				s.Invalidate()
				if got := s.Load().Snapshot.Seq; got < mine {
					t.Errorf("Load after change %d saw state %d", mine, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	last := s.Load()
	if last.Snapshot.Seq != state.Load() {
		t.Fatalf("final Load saw %d, state is %d", last.Snapshot.Seq, state.Load())
	}
	before := builds.Load()
	if s.Load() != last || builds.Load() != before {
		t.Fatal("Load without a change built a new value")
	}
}

// The zero Store serves what Store put there.
func TestStoreWithoutBuilder(t *testing.T) {
	var s Store
	p := New(&api.Snapshot{Seq: 3}, nil, nil)
	s.Store(p)
	s.Invalidate()
	if s.Load() != p {
		t.Fatal("Load did not return the stored value")
	}
}

// A waiter on Changed wakes at the next Invalidate and not before; channels
// taken after it wait for the change after that.
func TestChangedWakesWaitersOnce(t *testing.T) {
	var s Store
	var n atomic.Uint64
	s.SetBuilder(func() *Published { return New(&api.Snapshot{Seq: n.Load()}, nil, nil) })
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any change")
	default:
	}
	n.Add(1)
	s.Invalidate()
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by Invalidate")
	}
	if got := s.Load().Snapshot.Seq; got != 1 {
		t.Fatalf("Load after the change saw %d", got)
	}
	next := s.Changed()
	select {
	case <-next:
		t.Fatal("a channel taken after the change is already closed")
	default:
	}
	done := make(chan struct{})
	go func() { <-next; close(done) }()
	s.Invalidate()
	<-done
}

// The lease list is made only when a reader asks for it, once however many
// ask, and Lease finds each lease of it by id.
func TestLeasesAreListedOnFirstUseOnly(t *testing.T) {
	var lists atomic.Int64
	p := New(&api.Snapshot{}, func() []api.Lease {
		lists.Add(1)
		return []api.Lease{{ID: "l-1"}, {ID: "l-2", Task: "b"}, {ID: "l-3"}}
	}, nil)
	if p.JSON(); lists.Load() != 0 {
		t.Fatal("encoding the snapshot listed its leases")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l, ok := p.Lease("l-2"); !ok || l.Task != "b" {
				t.Errorf("Lease(l-2) = %+v, %v", l, ok)
			}
		}()
	}
	wg.Wait()
	if _, ok := p.Lease("l-0"); ok {
		t.Error("Lease found an id the list does not hold")
	}
	if n := lists.Load(); n != 1 || len(p.Leases()) != 3 {
		t.Errorf("listed %d times, %d leases; want once, 3", n, len(p.Leases()))
	}
	if empty := New(&api.Snapshot{}, nil, nil).Leases(); empty == nil || len(empty) != 0 {
		t.Errorf("no lister: Leases() = %#v, want an empty list", empty)
	}
}
