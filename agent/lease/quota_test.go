package lease

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
)

func TestQuotas(t *testing.T) {
	f := newFixture(t, 4, 4, 1)
	m := f.manager(t)
	m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{
		{Key: "alice", Kind: identity.User, ID: 1000, Limit: 3},
		{Key: "group:ml", Kind: identity.Group, ID: 50, Limit: 4},
		{Key: "*", Kind: identity.Everyone, Limit: 6},
	}))
	alice := identity.Peer{UID: 1000, GID: 1000, Groups: []uint32{50}}
	bob := identity.Peer{UID: 1001, GID: 50}
	carol := identity.Peer{UID: 1002, GID: 1002}
	ctx := context.Background()
	grant := func(p identity.Peer, units int) error {
		_, err := m.Acquire(ctx, p, ttlReq(units, "1m"))
		return err
	}
	if err := grant(alice, 2); err != nil {
		t.Fatal(err)
	}
	// alice's own quota: 2 held + 2 > 3.
	err := grant(alice, 2)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota alice: limit 3 unit(s), you hold 2, 2 more asked") {
		t.Fatalf("err = %v", err)
	}
	// bob is in group ml by his primary group: the group holds 2 of 4.
	if err := grant(bob, 2); err != nil {
		t.Fatal(err)
	}
	err = grant(bob, 1)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota group:ml: limit 4 unit(s), its members hold 4") {
		t.Fatalf("err = %v", err)
	}
	// Everyone together: 4 held, carol may take 2, not 3.
	err = grant(carol, 3)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota *: limit 6 unit(s), everyone holds 4") {
		t.Fatalf("err = %v", err)
	}
	if err := grant(carol, 2); err != nil {
		t.Fatal(err)
	}
	// Admins are bound by none, but what they hold counts toward "*". (An
	// admin of a uid of its own: the tests' root is whoever runs them, who
	// may be uid 1000.)
	admin := identity.Peer{UID: 4242, GID: 4242, Admin: true}
	if err := grant(admin, 1); err != nil {
		t.Fatal(err)
	}
	use := m.QuotaUse(alice)
	if len(use) != 3 || use[0].Held != 2 || use[1].Held != 4 || use[2].Held != 7 {
		t.Fatalf("QuotaUse = %+v", use)
	}
	// No quota binds an admin: none is listed for it.
	if use := m.QuotaUse(admin); len(use) != 0 {
		t.Fatalf("QuotaUse(admin) = %+v, want none", use)
	}
	// A dry run gets the refusal the lease would get.
	if _, err := m.Explain(carol, ttlReq(1, "1m")); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("dry run: %v", err)
	}
	// Releasing gives the room back; no quotas: nothing refused.
	for _, l := range m.List(root) {
		if err := m.Release(root, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	if u := m.QuotaUse(alice); u[0].Held != 0 || u[2].Held != 0 {
		t.Fatalf("after release %+v", u)
	}
	m.SetRules(placement.New(placement.BestFit), nil)
	if err := grant(alice, 4); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineClaimsCountTowardTheirOwner: a unit claimed through a pipe file
// counts toward its FIFO owner's quota, and stops counting when the claim
// ends.
func TestOfflineClaimsCountTowardTheirOwner(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	m := f.manager(t)
	me := uint32(os.Getuid())
	m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "me", Kind: identity.User, ID: me, Limit: 1}}))
	fd := claimOffline(t, f, 0, 0)
	testutil.Eventually(t, "offline claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	peer := identity.Peer{UID: me, GID: uint32(os.Getgid())}
	if _, err := m.Acquire(context.Background(), peer, ttlReq(1, "1m")); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("err = %v, want the offline claim counted", err)
	}
	unix.Close(fd)
	os.Remove(f.ledger.Path(0, 0))
	testutil.Eventually(t, "offline claim gone", func() bool { return m.View().GPUs[0].Offline == 0 })
	if _, err := m.Acquire(context.Background(), peer, ttlReq(1, "1m")); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineClaimsOverAQuotaAreShown: offline claims that lift their owner
// above a quota put it in the View's OverQuota, and log it; back under, it
// leaves the list, and that is logged too.
func TestOfflineClaimsOverAQuotaAreShown(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	var logs testutil.SyncBuffer
	m := f.manager(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	me := uint32(os.Getuid())
	m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "me", Kind: identity.User, ID: me, Limit: 1}}))
	first := claimOffline(t, f, 0, 0)
	testutil.Eventually(t, "the first claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	if over := m.View().OverQuota; len(over) != 0 {
		t.Fatalf("at the limit, shown over: %+v", over)
	}
	second := claimOffline(t, f, 0, 1)
	testutil.Eventually(t, "the quota shown over", func() bool {
		over := m.View().OverQuota
		return len(over) == 1 && over[0] == api.QuotaOver{Quota: "me", Limit: 1, Held: 2}
	})
	testutil.Eventually(t, "the excess logged", func() bool { return strings.Contains(logs.String(), "quota exceeded") })
	unix.Close(second)
	os.Remove(f.ledger.Path(0, 1))
	testutil.Eventually(t, "the quota back under", func() bool { return len(m.View().OverQuota) == 0 })
	testutil.Eventually(t, "the return logged", func() bool { return strings.Contains(logs.String(), "quota back under its limit") })
	unix.Close(first)
	// A lowered quota is shown over at once.
	third := claimOffline(t, f, 0, 2)
	defer unix.Close(third)
	testutil.Eventually(t, "the claim counted", func() bool { return m.View().GPUs[0].Offline >= 1 })
	m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "me", Kind: identity.User, ID: me, Limit: 0}}))
	if over := m.View().OverQuota; len(over) != 1 || over[0].Limit != 0 {
		t.Fatalf("after a lowered quota: %+v", over)
	}
}

// TestQuotasOfOneIDAllBind: a config may name one uid twice (its name and
// its number, or two names of one uid) and one gid twice (group:ml and
// group:50); each such quota applies, so the lowest binds, whichever comes
// last in the file.
func TestQuotasOfOneIDAllBind(t *testing.T) {
	f := newFixture(t, 4, 4, 1)
	m := f.manager(t)
	alice := identity.Peer{UID: 1000, GID: 1000, Groups: []uint32{50}}
	for _, tc := range []struct {
		quotas []config.Quota
		want   string
	}{
		{[]config.Quota{{Key: "alice", Kind: identity.User, ID: 1000, Limit: 2}, {Key: "1000", Kind: identity.User, ID: 1000, Limit: 8}}, "quota alice: limit 2"},
		{[]config.Quota{{Key: "1000", Kind: identity.User, ID: 1000, Limit: 8}, {Key: "alice", Kind: identity.User, ID: 1000, Limit: 2}}, "quota alice: limit 2"},
		{[]config.Quota{{Key: "group:ml", Kind: identity.Group, ID: 50, Limit: 2}, {Key: "group:50", Kind: identity.Group, ID: 50, Limit: 8}}, "quota group:ml: limit 2"},
	} {
		m.SetRules(placement.New(placement.BestFit), NewQuotas(tc.quotas))
		_, err := m.Acquire(context.Background(), alice, ttlReq(3, "1m"))
		if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("quotas %+v: err = %v, want %q", tc.quotas, err, tc.want)
		}
	}
}
