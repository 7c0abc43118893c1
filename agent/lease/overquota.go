package lease

// This file finds the quotas held above their limit. A lease is refused
// before it could lift a quota above its limit, but offline claims are made
// without asking (the ledger cannot refuse them), a reload may lower a
// quota, and reservations taken back at start are not checked again: each
// can leave a quota over. Such a quota is shown (the View, hence the
// snapshot, gpulet status and /metrics) and logged when it goes over and
// when it is back under; its holders get no new lease meanwhile, as the
// check of every lease counts what they hold.

import (
	"log/slog"
	"slices"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// overQuotaLocked lists the quotas held above their limit now, in the
// config's order, and logs those that went over or came back under since
// the last View.
func (m *Manager) overQuotaLocked() []api.QuotaOver {
	var out []api.QuotaOver
	if m.quotas != nil {
		reserved := m.res.reservedUseLocked()
		if reserved == nil {
			reserved = &quotaUse{}
		}
		for _, q := range m.quotas.all {
			var held, res int
			switch q.Kind {
			case identity.User:
				held, res = m.quotaUse.byUID[q.ID], reserved.byUID[q.ID]
			case identity.Group:
				held, res = m.quotaUse.byGID[q.ID], reserved.byGID[q.ID]
			default:
				held, res = m.quotaUse.total, reserved.total
			}
			if held+res > q.Limit {
				out = append(out, api.QuotaOver{Quota: q.Key, Limit: q.Limit, Held: held, Reserved: res})
			}
		}
	}
	var before []api.QuotaOver
	if v := m.view.Load(); v != nil {
		before = v.OverQuota
	}
	key := func(o api.QuotaOver) string { return o.Quota }
	for _, o := range out {
		if !slices.ContainsFunc(before, func(b api.QuotaOver) bool { return key(b) == o.Quota }) {
			m.infoLocked("quota exceeded: its holders get no new lease until back under (offline claims, a lowered quota or reservations lifted it)",
				slog.String("quota", o.Quota), slog.Int("limit", o.Limit), slog.Int("held", o.Held), slog.Int("reserved", o.Reserved))
		}
	}
	for _, b := range before {
		if !slices.ContainsFunc(out, func(o api.QuotaOver) bool { return key(o) == b.Quota }) {
			m.infoLocked("quota back under its limit", slog.String("quota", b.Quota), slog.Int("limit", b.Limit))
		}
	}
	return out
}
