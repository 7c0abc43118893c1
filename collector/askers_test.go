package collector

import (
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
// with 429 and why, at once; another client, named or at another address,
// is not; and once answered, the first may ask again.
func TestPlacementsBoundPerClient(t *testing.T) {
	st := NewStore(15*time.Second, nil)
	s := NewServer(st, nil)
	s.SetPolicy(placement.BestFit)
	s.Auth.LearnTokens = callerTokensFile(t, "a ta\nb tb\n")
	st.Apply(snapshotFree("n1", 4, 8))
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
	codes := make(chan int, 8)
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
	code, body := post("Bearer ta", "192.0.2.9:1000")
	if code != 429 || !strings.Contains(body, "caller a has 2 placement requests under way") || !strings.Contains(body, "wait for an answer") {
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
		done, err := q.take(client)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.enter(client)
			mu.Lock()
			order = append(order, label)
			mu.Unlock()
			q.leave()
			done()
		}()
	}
	done, err := q.take("flood")
	if err != nil {
		t.Fatal(err)
	}
	q.enter("flood") // the flood's first placement is under way
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
