package collector

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/placement"
)

// TestPlacementsBoundPerClient: a client with MaxPlacementsInFlight
// placements under way (here waiting, the placer held) is refused the next
// with 429 and why, after RefusalPause; another client, named or at another address,
// is not; and once answered, the first may ask again.
func TestPlacementsBoundPerClient(t *testing.T) {
	s := learningServer(t, placement.BestFit, "a ta\nb tb\n", snapshotFree("n1", 4, 8))
	post := func(auth, addr string) (int, string) {
		req := httptest.NewRequest("POST", "/v1/placements", strings.NewReader(`{"units":1}`))
		req.Header.Set("Authorization", auth)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	waitFor := func(client string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			s.placer.asking.mu.Lock()
			got := 0
			if a := s.placer.asking.by[client]; a != nil {
				got = a.inFlight
			}
			s.placer.asking.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d under way, want %d", client, got, n)
			}
		}
	}
	s.placer.mu.Lock() // every placement waits
	var wg sync.WaitGroup
	codes := make(chan int, 2*MaxPlacementsInFlight+2)
	ask := func(auth, addr string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := post(auth, addr)
			codes <- code
		}()
	}
	for range MaxPlacementsInFlight {
		ask("Bearer ta", "192.0.2.1:1000")
	}
	waitFor("caller a", MaxPlacementsInFlight)
	// From another address, the same caller is the same client.
	began := time.Now()
	code, body := post("Bearer ta", "192.0.2.9:1000")
	if waited := time.Since(began); waited < RefusalPause {
		t.Errorf("refused after %v, want a pause of %v first", waited, RefusalPause)
	}
	if code != 429 || !strings.Contains(body, fmt.Sprintf("caller a has %d placement requests under way", MaxPlacementsInFlight)) || !strings.Contains(body, "wait for an answer") {
		t.Fatalf("caller a's next: %d %s, want 429 and why", code, body)
	}
	ask("Bearer tb", "192.0.2.1:1000")
	waitFor("caller b", 1)
	// Clients of no caller named are told apart by their address.
	for range MaxPlacementsInFlight {
		ask("", "192.0.2.2:1000")
	}
	waitFor("the client at 192.0.2.2", MaxPlacementsInFlight)
	if code, body := post("", "192.0.2.2:2000"); code != 429 || !strings.Contains(body, "the client at 192.0.2.2 has") {
		t.Fatalf("the client at 192.0.2.2's next: %d %s, want 429", code, body)
	}
	ask("", "192.0.2.3:1000")
	waitFor("the client at 192.0.2.3", 1)
	s.placer.mu.Unlock()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Errorf("a placement within the bound: %d, want 200", code)
		}
	}
	if code, body := post("Bearer ta", "192.0.2.1:1000"); code != 200 {
		t.Fatalf("caller a, answered: %d %s, want 200", code, body)
	}
	if len(s.placer.asking.by) != 0 {
		t.Fatalf("under way after every answer: %v", s.placer.asking.by)
	}
}

// TestPlacementsTakeTurns: of the clients waiting to place, the one let
// through longest ago goes first, one not let through yet before any, and
// a client's own placements in the order they came. A flooding client
// with its bound waiting delays another by one placement, not two.
func TestPlacementsTakeTurns(t *testing.T) {
	var q askers
	var order []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	waiters := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			q.mu.Lock()
			got := 0
			for _, a := range q.by {
				got += len(a.waiting)
			}
			q.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", got, n)
			}
		}
	}
	place := func(client, label string) {
		done, err := q.take(client, false)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.enter(context.Background(), client); err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, label)
			mu.Unlock()
			q.leave()
			done()
		}()
	}
	done, err := q.take("flood", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.enter(context.Background(), "flood"); err != nil { // the flood's first placement is under way
		t.Fatal(err)
	}
	place("flood", "flood 2")
	waiters(1)
	place("other", "other 1")
	waiters(2)
	q.leave()
	done()
	wg.Wait()
	if want := []string{"other 1", "flood 2"}; !slices.Equal(order, want) {
		t.Fatalf("let through %v, want %v", order, want)
	}
	if len(q.by) != 0 || q.busy || len(q.arrived) != 0 {
		t.Fatalf("after every placement: %d clients, busy %v, %d waiting", len(q.by), q.busy, len(q.arrived))
	}
}

// TestPlacementsWaitingGiveUp: a request that gives up while waiting for
// its turn (its client went away) leaves the queue and its client's
// count; the turn goes on to the next, whether it gave up before its turn
// came or as it came.
func TestPlacementsWaitingGiveUp(t *testing.T) {
	var q askers
	done, err := q.take("a", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.enter(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bDone, err := q.take("b", false)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error)
	go func() { gaveUp <- q.enter(ctx, "b") }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q.mu.Lock()
		n := len(q.arrived)
		q.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never waited")
		}
	}
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("b's request gave up, and enter returned no error")
	}
	bDone()
	if len(q.arrived) != 0 || q.by["b"] != nil {
		t.Fatalf("after b gave up: waiting %v, b %+v", q.arrived, q.by["b"])
	}
	q.leave()
	done()
	if q.busy || len(q.by) != 0 || q.anonymous != 0 {
		t.Fatalf("after every placement: busy %v, clients %v, %d under way", q.busy, q.by, q.anonymous)
	}
	// Giving up as the turn comes, again and again: no turn is lost.
	for range 200 {
		done, _ := q.take("a", false)
		if err := q.enter(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		bDone, _ := q.take("b", false)
		gaveUp := make(chan error)
		go func() {
			err := q.enter(ctx, "b")
			if err == nil {
				q.leave()
			}
			gaveUp <- err
		}()
		go cancel()
		q.leave()
		done()
		<-gaveUp
		bDone()
		cDone, _ := q.take("c", false)
		if err := q.enter(context.Background(), "c"); err != nil {
			t.Fatal(err)
		}
		q.leave()
		cDone()
		if q.busy || len(q.by) != 0 || len(q.arrived) != 0 || q.anonymous != 0 {
			t.Fatalf("busy %v, clients %v, waiting %v, %d under way", q.busy, q.by, q.arrived, q.anonymous)
		}
	}
}

// TestPlacementsWaitingBound: past MaxPlacementsWaiting requests under way
// of clients known by their address, each within its own bound, the next
// such client is refused, and taken again once one is answered; a caller
// of --learn-tokens-file is not shut out.
func TestPlacementsWaitingBound(t *testing.T) {
	var q askers
	var dones []func()
	for i := range MaxPlacementsWaiting {
		done, err := q.take(fmt.Sprintf("the client at 192.0.2.%d", i), false)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		dones = append(dones, done)
	}
	if _, err := q.take("the client at 198.51.100.1", false); err == nil || !strings.Contains(err.Error(), "the collector has 4096 placement requests under way of clients known by their address") {
		t.Fatalf("past the bound: %v, want refused", err)
	}
	named, err := q.take("caller sched", true)
	if err != nil {
		t.Fatalf("a caller of --learn-tokens-file past the bound of the others: %v", err)
	}
	named()
	dones[0]()
	done, err := q.take("the client at 198.51.100.1", false)
	if err != nil {
		t.Fatalf("once one was answered: %v", err)
	}
	done()
	for _, done := range dones[1:] {
		done()
	}
	if len(q.by) != 0 || q.anonymous != 0 {
		t.Fatalf("after every request: %d clients, %d under way", len(q.by), q.anonymous)
	}
}
