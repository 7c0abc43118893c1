package lease

import (
	"slices"
	"strings"

	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// Quotas is a set of quotas indexed for a request's check: what one check
// costs grows with the caller's groups, not with the quotas configured.
type Quotas struct {
	byUID    map[uint32]config.Quota
	byGID    map[uint32]config.Quota
	everyone *config.Quota
	// all are the quotas in force (a repeated one once), by key.
	all []config.Quota
}

// NewQuotas indexes the config's quotas (docs/design.md §11): a user's caps
// the units its uid holds, a group's those all its members hold together,
// and "*" those everyone holds together. One uid or gid may have several
// quotas (alice and 1000, group:ml and group:50, two names of one uid): each
// applies and they count the same units, so the lowest is kept, the one
// that binds (the first of equal ones).
func NewQuotas(qs []config.Quota) *Quotas {
	out := &Quotas{byUID: map[uint32]config.Quota{}, byGID: map[uint32]config.Quota{}}
	for _, q := range qs {
		switch q.Kind {
		case identity.User:
			keepLowest(out.byUID, q)
		case identity.Group:
			keepLowest(out.byGID, q)
		case identity.Everyone:
			out.everyone = &q
		}
	}
	for _, byID := range []map[uint32]config.Quota{out.byUID, out.byGID} {
		for _, q := range byID {
			out.all = append(out.all, q)
		}
	}
	if out.everyone != nil {
		out.all = append(out.all, *out.everyone)
	}
	slices.SortFunc(out.all, func(a, b config.Quota) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// keepLowest puts q in byID unless a quota of its id as low is there.
func keepLowest(byID map[uint32]config.Quota, q config.Quota) {
	if have, ok := byID[q.ID]; !ok || q.Limit < have.Limit {
		byID[q.ID] = q
	}
}

// quotaUse counts the units held, for quotas: per uid (leases and offline claims,
// an offline claim counting toward its FIFO's owner), per group (leases, by
// the groups their caller had), and in all.
type quotaUse struct {
	byUID map[uint32]int
	byGID map[uint32]int
	total int
}

func newQuotaUse() quotaUse { return quotaUse{byUID: map[uint32]int{}, byGID: map[uint32]int{}} }

// add counts n units (n < 0: no longer) held by uid in groups gids.
func (u *quotaUse) add(uid uint32, gids []uint32, n int) {
	u.total += n
	bump(u.byUID, uid, n)
	for _, g := range gids {
		bump(u.byGID, g, n)
	}
}

func bump(m map[uint32]int, k uint32, n int) {
	if m[k] += n; m[k] <= 0 {
		delete(m, k)
	}
}

// QuotaUse is one quota that applies to a caller, with what is held against
// it now (leases and offline claims) and what reservations set aside
// against it beyond that (reservation_quota.go).
type QuotaUse struct {
	config.Quota
	Held     int
	Reserved int
}

// each calls fn with every quota that applies to a caller of uid in groups
// gids (its own, its groups', everyone's), what is held against it (u) and
// what is reserved (r; nil: nothing), until fn returns an error, which it
// returns. It makes nothing: a lease's check goes through it on every
// request.
func (q *Quotas) each(uid uint32, gids []uint32, u, r *quotaUse, fn func(QuotaUse) error) error {
	if q == nil {
		return nil
	}
	if r == nil {
		r = &quotaUse{}
	}
	if qu, ok := q.byUID[uid]; ok {
		if err := fn(QuotaUse{qu, u.byUID[uid], r.byUID[uid]}); err != nil {
			return err
		}
	}
	for _, g := range gids {
		if qg, ok := q.byGID[g]; ok {
			if err := fn(QuotaUse{qg, u.byGID[g], r.byGID[g]}); err != nil {
				return err
			}
		}
	}
	if q.everyone != nil {
		return fn(QuotaUse{*q.everyone, u.total, r.total})
	}
	return nil
}

// applying lists the quotas that apply to a caller of uid in groups gids.
func (q *Quotas) applying(uid uint32, gids []uint32, u, r *quotaUse) []QuotaUse {
	var out []QuotaUse
	q.each(uid, gids, u, r, func(qu QuotaUse) error { out = append(out, qu); return nil })
	return out
}

// checkQuotaLocked refuses a request for units that would lift its caller
// above a quota that applies, counting what reservations set aside; admins
// are bound by none. A draw on the caller's own reservation adds nothing:
// its units were counted when it was made.
func (m *Manager) checkQuotaLocked(peer identity.Peer, units int, reservation string) error {
	if peer.Admin || m.quotas == nil {
		return nil
	}
	if m.res.ownedLocked(reservation, peer.UID) {
		return nil
	}
	reserved := m.res.reservedUseLocked()
	return m.quotas.each(peer.UID, peer.GIDs(), &m.quotaUse, reserved, func(q QuotaUse) error {
		return exceeds(q, units)
	})
}

func exceeds(q QuotaUse, units int) error {
	if q.Held+q.Reserved+units <= q.Limit {
		return nil
	}
	whose := "you hold"
	switch q.Kind {
	case identity.Group:
		whose = "its members hold"
	case identity.Everyone:
		whose = "everyone holds"
	}
	if q.Reserved > 0 {
		return errdefs.Errorf(errdefs.ErrQuota, "quota %s: limit %d unit(s), %s %d and reservations set %d aside (pending ones count too), %d more asked",
			q.Key, q.Limit, whose, q.Held, q.Reserved, units)
	}
	return errdefs.Errorf(errdefs.ErrQuota, "quota %s: limit %d unit(s), %s %d, %d more asked", q.Key, q.Limit, whose, q.Held, units)
}

// SetRules puts a config's placement engine (pools, score weights) and
// quotas (nil: none) in force together, under the lock every decision holds:
// a request sees both old or both new, never a mix. Leases held beyond a
// lowered quota stay; new ones are refused.
func (m *Manager) SetRules(e *placement.Engine, q *Quotas) {
	m.mu.Lock()
	m.engine.Store(e)
	m.quotas = q
	// Which quotas are over may change: the View says it.
	m.dirty = true
	m.unlock()
}

// SetEngine puts a new placement engine in force, the quotas staying: the
// frag policy's engine changes as the request mix it weighs is learned.
func (m *Manager) SetEngine(e *placement.Engine) { m.engine.Store(e) }

// QuotaUse lists the quotas that bind peer and what is held against each;
// none for admins, whom no quota binds.
func (m *Manager) QuotaUse(peer identity.Peer) []QuotaUse {
	if peer.Admin {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.quotas.applying(peer.UID, peer.GIDs(), &m.quotaUse, m.res.reservedUseLocked())
}
