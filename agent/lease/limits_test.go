package lease

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
)

func TestUIDCap(t *testing.T) {
	var c uidCap
	r1, err := c.take(7, 2)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.take(7, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.take(7, 2); !errors.Is(err, api.ErrTooManyRequests) {
		t.Fatalf("third take: %v, want too_many_requests", err)
	}
	if _, err := c.take(8, 2); err != nil {
		t.Fatalf("another uid: %v", err)
	}
	for range 5 {
		if _, err := c.take(0, 2); err != nil {
			t.Fatalf("root: %v", err)
		}
	}
	r1()
	r1() // a second release changes nothing
	if c.count(7) != 1 {
		t.Fatalf("count after one release = %d, want 1", c.count(7))
	}
	if _, err := c.take(7, 2); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	r2()
	if _, err := c.take(9, 0); err != nil {
		t.Fatalf("no cap: %v", err)
	}
}

// TestWaitersPerUIDAreCapped: one user's queued requests stop at the cap,
// with too_many_requests, while other users still queue; a waiter that ends
// frees its place.
func TestWaitersPerUIDAreCapped(t *testing.T) {
	f := newFixture(t, 1, 1, 1) // 2 GPUs × 1 unit
	m := f.manager(t, func(c *Config) { c.MaxWaitersPerUID = 2 })
	for range 2 {
		if _, err := m.Acquire(context.Background(), root, ttlReq(1, "1m")); err != nil {
			t.Fatal(err)
		}
	}
	user := identity.Peer{UID: 4242, GID: 4242, PID: os.Getpid()}
	other := identity.Peer{UID: 4343, GID: 4343, PID: os.Getpid()}
	req := ttlReq(1, "1m")
	req.Wait = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 4)
	wait := func(ctx context.Context, p identity.Peer) {
		go func() { _, err := m.Acquire(ctx, p, req); ended <- err }()
	}
	first, cancelFirst := context.WithCancel(ctx)
	wait(first, user)
	wait(ctx, user)
	testutil.Eventually(t, "two waiters of uid 4242", func() bool { return m.waitCap.count(4242) == 2 })
	_, err := m.Acquire(ctx, user, req)
	if !errors.Is(err, api.ErrTooManyRequests) {
		t.Fatalf("third waiter: %v, want too_many_requests", err)
	}
	if status, code := api.StatusOf(err); status != 429 || code != "too_many_requests" {
		t.Fatalf("maps to %d %s, want 429 too_many_requests", status, code)
	}
	// Without wait the request is not queued, so not capped.
	if _, err := m.Acquire(ctx, user, ttlReq(1, "1m")); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("request without wait: %v, want insufficient_units", err)
	}
	wait(ctx, other)
	testutil.Eventually(t, "a waiter of uid 4343", func() bool { return m.waitCap.count(4343) == 1 })
	cancelFirst()
	if err := <-ended; !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	testutil.Eventually(t, "the cancelled waiter's place to be freed", func() bool { return m.waitCap.count(4242) == 1 })
	wait(ctx, user)
	testutil.Eventually(t, "uid 4242 to queue again", func() bool { return m.waitCap.count(4242) == 2 })
}
