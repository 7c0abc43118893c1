package lease

import (
	"cmp"
	"slices"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// List lists the reservations as last published, by name.
func (rs *Reservations) List() []api.Reservation {
	return rs.t.View().Reservations
}

// Get returns reservation name as last published.
func (rs *Reservations) Get(name string) (api.Reservation, error) {
	for _, r := range rs.t.View().Reservations {
		if r.Name == name {
			return r, nil
		}
	}
	return api.Reservation{}, errdefs.Errorf(errdefs.ErrNotFound, "no reservation named %q", name)
}

// reservationViewsLocked is what the View shows of the reservations.
func (rs *Reservations) reservationViewsLocked() []api.Reservation {
	if len(rs.byName) == 0 {
		return nil
	}
	out := make([]api.Reservation, 0, len(rs.byName))
	for _, r := range rs.byName {
		out = append(out, rs.reservationViewLocked(r))
	}
	slices.SortFunc(out, func(a, b api.Reservation) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func (rs *Reservations) reservationViewLocked(r *reservation) api.Reservation {
	u := rs.usageLocked(r)
	v := api.Reservation{
		ReservationStatus: api.ReservationStatus{
			Name: r.Name, State: api.ReservationPending, Priority: r.Priority,
			Stage: r.stage, Stages: len(r.Needs), Need: r.need(), InUse: u.inUse,
			Lent: u.lent, Reclaiming: u.reclaiming, Reclaimed: r.reclaimed,
		},
		Owner: r.owner, Needs: r.Needs, Created: r.created,
	}
	if r.active {
		v.State, v.Reserved = api.ReservationActive, len(r.slots)
		v.Lendable = reserve.Lendable(v.Reserved, r.need())
	} else {
		v.Held = len(r.slots)
	}
	for i, mb := range r.Share {
		v.Share = append(v.Share, api.ShareMember{User: mb.Name, Weight: mb.Weight})
		if u.lentTo[i] > 0 {
			if v.LentTo == nil {
				v.LentTo = map[string]int{}
			}
			v.LentTo[mb.Name] = u.lentTo[i]
		}
	}
	for _, ref := range r.slots {
		if n := len(v.Units); n == 0 || v.Units[n-1].GPU != rs.t.gpus[ref.g].dev.Index {
			v.Units = append(v.Units, api.ReservationUnits{GPU: rs.t.gpus[ref.g].dev.Index, UUID: rs.t.gpus[ref.g].dev.UUID})
		}
		last := &v.Units[len(v.Units)-1]
		last.Units = append(last.Units, ref.u)
	}
	return v
}
