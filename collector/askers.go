package collector

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
)

// MaxPlacementsInFlight is how many POST /v1/placements one client may
// have under way at once, placed or waiting for its turn; past it, the
// next is refused (429). Placements are answered one at a time (the
// cluster's models have one owner), so a client gains nothing from asking
// more at once; but a request that waits costs the collector a parked
// goroutine and no CPU, where a refusal costs a round trip, which a client
// that asks again at once repeats as fast as it is refused. So a client's
// requests wait their turn, as many as a scheduler's workers might send,
// and only a client past that is refused (docs/BENCHMARKS.md §17, the
// flooded rounds).
const MaxPlacementsInFlight = 64

// MaxPlacementsWaiting bounds the placement requests under way of the
// clients known by their address alone, all together: clients at many
// addresses cannot hold the collector's memory with waiting requests, and
// cannot shut out the callers of --learn-tokens-file, who are as many as
// the file names and bounded each. Past it, the next of those clients is
// refused (429).
const MaxPlacementsWaiting = 4096

// RefusalPause is how long a placement request refused for a bound
// (MaxPlacementsInFlight, MaxPlacementsWaiting) waits before its 429, its
// goroutine parked: a client that asks again as soon as it is refused then
// asks ten times a second on each connection, not as fast as the collector
// can refuse it, which took the CPU the placements of others needed
// (docs/BENCHMARKS.md §17, frag-flooded-wide). A client within its bound
// never waits it.
const RefusalPause = 100 * time.Millisecond

// pauseRefusal waits RefusalPause, or until ctx ends.
func pauseRefusal(ctx context.Context) {
	t := time.NewTimer(RefusalPause)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// askers bounds each client's placement requests under way and lets them
// place one at a time, of the clients waiting the one let through longest
// ago first (one not let through since it last had none under way before
// any; among those, the one that began to wait first). So a client that
// floods the collector waits its turn: it delays another's placement by
// the one being placed, not by its queue.
type askers struct {
	mu        sync.Mutex // guards everything below
	busy      bool       // a placement is under way
	seq       uint64     // placements let through
	anonymous int        // requests under way of the clients known by address
	by        map[string]*asker
	// arrived is the clients waiting, by when they began to.
	arrived []string
}

// asker is one client with placements under way; forgotten when it has
// none.
type asker struct {
	inFlight int
	waiting  []chan struct{}
	last     uint64 // askers.seq when it was last let through; 0: not yet
}

// take counts one more request of client, named (a caller of
// --learn-tokens-file) or known by its address, or refuses it when client
// has MaxPlacementsInFlight under way, or, known by its address, when
// those clients have MaxPlacementsWaiting; done ends it.
func (q *askers) take(client string, named bool) (done func(), err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.by[client]
	switch {
	case a != nil && a.inFlight >= MaxPlacementsInFlight:
		return nil, api.Errorf(api.ErrTooManyRequests, "%s has %d placement requests under way, as many as one client may at once: placements are answered one at a time, so wait for an answer before asking again", client, MaxPlacementsInFlight)
	case !named && q.anonymous >= MaxPlacementsWaiting:
		return nil, api.Errorf(api.ErrTooManyRequests, "the collector has %d placement requests under way of clients known by their address, as many as it holds at once: ask again later, or as a caller of its --learn-tokens-file", MaxPlacementsWaiting)
	}
	if a == nil {
		a = &asker{}
		if q.by == nil {
			q.by = map[string]*asker{}
		}
		q.by[client] = a
	}
	a.inFlight++
	if !named {
		q.anonymous++
	}
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if !named {
			q.anonymous--
		}
		if a.inFlight--; a.inFlight == 0 {
			delete(q.by, client)
		}
	}, nil
}

// enter waits for the turn of client, which take counted, or until ctx
// ends: then it returns ctx's error and has no turn to leave.
func (q *askers) enter(ctx context.Context, client string) error {
	q.mu.Lock()
	a := q.by[client]
	if !q.busy {
		q.busy = true
		q.seq++
		a.last = q.seq
		q.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	if len(a.waiting) == 0 {
		q.arrived = append(q.arrived, client)
	}
	a.waiting = append(a.waiting, ch)
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	select {
	case <-ch:
		// The turn came meanwhile: the next client's.
		q.mu.Unlock()
		q.leave()
		return ctx.Err()
	default:
	}
	a.waiting = slices.DeleteFunc(a.waiting, func(c chan struct{}) bool { return c == ch })
	if len(a.waiting) == 0 {
		q.arrived = slices.DeleteFunc(q.arrived, func(c string) bool { return c == client })
	}
	q.mu.Unlock()
	return ctx.Err()
}

// leave ends a turn and lets the next client through.
func (q *askers) leave() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.arrived) == 0 {
		q.busy = false
		return
	}
	next := 0
	for i, c := range q.arrived {
		if q.by[c].last < q.by[q.arrived[next]].last {
			next = i
		}
	}
	a := q.by[q.arrived[next]]
	ch := a.waiting[0]
	if a.waiting = a.waiting[1:]; len(a.waiting) == 0 {
		q.arrived = append(q.arrived[:next], q.arrived[next+1:]...)
	}
	q.seq++
	a.last = q.seq
	close(ch)
}

// placementClient names who asks for a placement, for the bound: the
// caller of --learn-tokens-file it is, else the address it asks from.
func placementClient(caller, remoteAddr string) string {
	if caller != "" {
		return "caller " + caller
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	return "the client at " + host
}
