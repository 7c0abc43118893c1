package lease

// This file is the lease engine's side of workflow reservations (docs/design.md §1.6
// and §12): which units a reservation holds, admitting pending reservations in
// priority order (advancing stages and taking lent units back are in
// reservation_reclaim.go, what the View shows in view.go). What a
// reservation is (its checks, the stage arithmetic, shares by weight, its
// file) is package reserve's.
//
// A reservation's units are slots of the unit table marked with it
// (slot.res). An idle one is slotReserved: neither free nor used. A lease on
// one (its owner's draw, or a share member's borrow) or an offline claim makes
// it used; when that ends, the unit is the reservation's again (slot.vacate).
// A reservation may span instances and GPUs; each lease still fits one GPU
// and one instance. A pending reservation first in line holds, the same way,
// the units it could use as they free, so that a stream of small leases
// cannot starve it; it is admitted once it can have all it needs.

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// Bounds on reservations, so that no user can make the daemon keep much.
const (
	maxReservations       = 1024
	maxReservationsPerUID = 16
)

// Reservations is the workflow-reservation feature: the reservations, their
// queue and their file. Its state is guarded by the table's lock; the table
// calls it through its hooks, and counts what it sets aside against quotas
// and shows it in the View.
type Reservations struct {
	noHooks
	t *Manager
	// byName are the workflow reservations; pending counts those waiting
	// for units, and seq numbers them in the order they were made.
	byName  map[string]*reservation
	pending int
	seq     uint64
	// priorityCeiling is the highest reservation priority a caller who is
	// not an admin may ask (reservation_quota.go).
	priorityCeiling atomic.Int64
	// failed says why the reservations file cannot be written now; nil
	// when it can. unread says why the file found at start could be
	// neither read nor set aside: then it is never written over.
	failed, unread error
	// scratch is the placement view of a reservation's units, and
	// scratchFree the free-unit lists it is made of, per GPU and instance.
	scratch     placement.Node
	scratchFree [][]int
}

// Reservations is the table's workflow-reservation feature.
func (m *Manager) Reservations() *Reservations { return m.res }

type reservation struct {
	reserve.Spec
	owner api.ReservationOwner
	// groups and admin are what its owner had when it reserved: its units
	// go only where its owner's leases may (pools), and count toward its
	// groups' quotas. The file keeps the groups; not admin: a reservation
	// taken back at start is an admin's only when its owner is root.
	groups  []uint32
	admin   bool
	created time.Time
	// seq orders reservations made in the same instant.
	seq uint64
	// active is false while the reservation is pending.
	active bool
	// stage is the current stage; reclaimed what its start took back.
	stage     int
	reclaimed int
	// slots are its units (set aside, or held while pending), by GPU, then
	// unit.
	slots []slotRef
	// reclaiming are the borrowed leases being taken back, and when their
	// holders get SIGKILL.
	reclaiming map[string]time.Time
}

// slotRef names unit u of GPU g.
type slotRef struct{ g, u int }

func (a slotRef) compare(b slotRef) int {
	if c := cmp.Compare(a.g, b.g); c != 0 {
		return c
	}
	return cmp.Compare(a.u, b.u)
}

// vacate empties a slot whose lease or claim ended: free, or its
// reservation's again.
func (s *slot) vacate() {
	*s = slot{own: s.own, res: s.res}
	if s.res != nil {
		s.state = slotReserved
	}
}

// first reports whether a is served before b: higher priority, then older.
func (a *reservation) first(b *reservation) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	return a.seq < b.seq
}

// need is the current stage's units.
func (r *reservation) need() int { return r.Needs[r.stage] }

// memberIndex is the share member a borrowed lease counts toward: the one of
// that name, else the first listed (a lease whose member is unknown is still
// taken back); -1 when the group is empty.
func (r *reservation) memberIndex(name string) int {
	for i, m := range r.Share {
		if m.Name == name {
			return i
		}
	}
	if len(r.Share) == 0 {
		return -1
	}
	return 0
}

// usage is how a reservation's units are used now.
type usage struct {
	idle, inUse, lent, reclaiming int
	// lentTo counts, per share member, the units lent to it; keep the part
	// of them not being taken back.
	lentTo, keep []int
}

func (rs *Reservations) usageLocked(r *reservation) usage {
	u := usage{lentTo: make([]int, len(r.Share)), keep: make([]int, len(r.Share))}
	for _, ref := range r.slots {
		s := &rs.t.gpus[ref.g].slots[ref.u]
		switch {
		case s.state == slotReserved:
			u.idle++
		case s.state != slotLeased:
		case !s.lease.Preemptible || s.lease.Reservation != r.Name:
			u.inUse++
		default:
			u.lent++
			if s.lease.reclaiming {
				u.reclaiming++
			}
			if i := r.memberIndex(s.lease.share); i >= 0 {
				u.lentTo[i]++
				if !s.lease.reclaiming {
					u.keep[i]++
				}
			}
		}
	}
	return u
}

// mayManage reports whether peer may advance or end r: its owner and admins.
func mayManage(peer identity.Peer, r *reservation) bool {
	return peer.Admin || peer.UID == 0 || peer.UID == r.owner.UID
}

// Reserve makes a reservation for peer: it sets aside the units of its
// largest stage at once, or fails with insufficient_units; with Wait it
// stays pending until they can be had. Pending reservations go before it
// when their priority is higher or equal.
func (rs *Reservations) Reserve(peer identity.Peer, spec reserve.Spec) (api.Reservation, error) {
	if err := spec.Resolve(rs.t.cfg.Accounts); err != nil {
		return api.Reservation{}, err
	}
	if err := rs.checkPriority(peer, spec.Priority); err != nil {
		return api.Reservation{}, err
	}
	total := rs.t.cfg.Model.UnitsPerGPU * len(rs.t.gpus)
	for i, n := range spec.Needs {
		if n > total {
			return api.Reservation{}, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d]: %d units, more than this node has (%d)", i, n, total)
		}
	}
	if !rs.t.lockOpen() {
		return api.Reservation{}, errStopping
	}
	defer rs.t.unlock()
	if rs.unread != nil {
		return api.Reservation{}, unsaved("nothing is reserved", rs.unread)
	}
	if _, dup := rs.byName[spec.Name]; dup {
		return api.Reservation{}, errdefs.Errorf(errdefs.ErrConflict, "name: a reservation named %q exists already", spec.Name)
	}
	if len(rs.byName) >= maxReservations {
		return api.Reservation{}, errdefs.Errorf(errdefs.ErrTooMany, "this node holds %d reservations, the most it keeps", maxReservations)
	}
	if !peer.Admin && peer.UID != 0 {
		mine := 0
		for _, r := range rs.byName {
			if r.owner.UID == peer.UID {
				mine++
			}
		}
		if mine >= maxReservationsPerUID {
			return api.Reservation{}, errdefs.Errorf(errdefs.ErrTooMany, "you hold %d reservations, the most one user may", mine)
		}
	}
	rs.seq++
	r := &reservation{Spec: spec, owner: api.ReservationOwner{UID: peer.UID, GID: peer.GID},
		groups: peer.GIDs(), admin: peer.Admin || peer.UID == 0,
		created: rs.t.clock.Now().UTC(), seq: rs.seq, reclaiming: map[string]time.Time{}}
	if err := rs.reservableLocked(r); err != nil {
		return api.Reservation{}, err
	}
	ahead := 0
	for _, p := range rs.byName {
		if !p.active && p.first(r) {
			ahead++
		}
	}
	if ahead > 0 && !spec.Wait {
		return api.Reservation{}, errdefs.Errorf(errdefs.ErrNoCapacity, "%d reservation(s) of higher or equal priority wait for units before this one; with \"wait\": true (gpulet reserve --wait) it waits too", ahead)
	}
	rs.byName[r.Name] = r
	rs.pending++
	if ahead == 0 {
		choices, err := rs.placeReservationLocked(r)
		switch {
		case err == nil:
			rs.holdLocked(r, choices)
			if err := rs.activateLocked(r); err != nil {
				rs.dropReservationLocked(r)
				// Units this one took from a pending reservation's hold go
				// back to it.
				rs.admitLocked()
				return api.Reservation{}, err
			}
			rs.t.infoLocked("reservation made", slog.String("reservation", r.Name), slog.Uint64("uid", uint64(r.owner.UID)),
				slog.Int("units", len(r.slots)), slog.Any("needs", r.Needs), slog.Int("priority", r.Priority))
			return rs.reservationViewLocked(r), nil
		case !spec.Wait || !isInsufficient(err):
			rs.dropReservationLocked(r)
			if isInsufficient(err) {
				err = fmt.Errorf("reserving %d unit(s): %w; with \"wait\": true (gpulet reserve --wait) it waits for them, holding units as they free", r.Size(), err)
			}
			return api.Reservation{}, err
		}
	}
	if err := rs.saveReservationsLocked(); err != nil {
		rs.dropReservationLocked(r)
		return api.Reservation{}, unsaved("nothing is reserved", err)
	}
	rs.t.dirty = true
	rs.t.infoLocked("reservation pending", slog.String("reservation", r.Name), slog.Uint64("uid", uint64(r.owner.UID)),
		slog.Int("units", r.Size()), slog.Int("priority", r.Priority), slog.Int("ahead", ahead))
	// First in line, it holds what frees from now on.
	rs.t.serveWaitersLocked()
	return rs.reservationViewLocked(r), nil
}

// reservableLocked refuses, wait or not, a reservation that could never be
// admitted or never be used whole: larger than what its owner's pools (and
// the node's GPUs) hold, or than a quota that binds its owner, whose units
// could never all be leased. Waiting for it would hold units from everyone
// for nothing.
func (rs *Reservations) reservableLocked(r *reservation) error {
	size := r.Size()
	reach, err := rs.t.engine.Load().Reachable(rs.t.pub.nodeLocked(), placement.Request{Units: size, UID: r.owner.UID, GIDs: r.groups, Admin: r.admin})
	if err != nil {
		return err
	}
	if size > reach {
		return &neverReservable{errdefs.Errorf(errdefs.ErrNoCapacity, "%s: reserving %d unit(s): the GPUs you may use hold %d", placement.ErrNeverFits, size, reach)}
	}
	if r.admin {
		return nil
	}
	for _, q := range rs.t.quotas.applying(r.owner.UID, r.groups, &rs.t.quotaUse, rs.reservedUseLocked()) {
		if size > q.Limit {
			return errdefs.Errorf(errdefs.ErrQuota, "quota %s: limit %d unit(s), less than the %d this reservation sets aside, which could never all be leased", q.Key, q.Limit, size)
		}
		// Reserved units count toward the owner's quotas, summed over all
		// its reservations, pending ones included.
		if err := exceeds(q, size); err != nil {
			return err
		}
	}
	return nil
}

// neverReservable is an insufficient_units error that also matches
// placement.ErrNeverFits.
type neverReservable struct{ error }

func (e *neverReservable) Is(target error) bool { return target == placement.ErrNeverFits }
func (e *neverReservable) Unwrap() error        { return e.error }

// placeReservationLocked picks units for r from the free ones and those held
// for pending reservations; on insufficient_units, the choices are what it
// could have.
func (rs *Reservations) placeReservationLocked(r *reservation) ([]placement.Choice, error) {
	uid := r.owner.UID
	n := rs.restrictedNodeLocked(func(add func(g, u int)) {
		for gi, g := range rs.t.gpus {
			for u := range g.slots {
				if s := &g.slots[u]; s.state == slotFree || s.state == slotReserved && !s.res.active {
					add(gi, u)
				}
			}
		}
	}, &uid, r.Size())
	return rs.t.engine.Load().Reserve(n, placement.Request{Units: r.Size(), UID: uid, GIDs: r.groups, Admin: r.admin})
}

// holdLocked makes the units of choices r's, and gives back to the node the
// units held for pending reservations that choices leaves out. Only the
// slots that change are touched.
func (rs *Reservations) holdLocked(r *reservation, choices []placement.Choice) {
	var want []slotRef
	for _, c := range choices {
		for _, u := range c.Units {
			want = append(want, slotRef{c.GPU, u})
		}
	}
	slices.SortFunc(want, slotRef.compare)
	for _, p := range rs.byName {
		if p.active {
			continue
		}
		for _, ref := range p.slots {
			if _, keep := slices.BinarySearchFunc(want, ref, slotRef.compare); keep && p == r {
				continue
			}
			rs.releaseSlotLocked(ref)
		}
		p.slots = nil
	}
	for _, ref := range want {
		s := &rs.t.gpus[ref.g].slots[ref.u]
		if s.res == r {
			continue
		}
		s.res = r
		if s.state == slotFree {
			s.state = slotReserved
		}
		rs.t.touchLocked(ref.g)
	}
	r.slots = want
}

// releaseSlotLocked gives a reservation's unit back to the node: free when
// idle; what uses it keeps it.
func (rs *Reservations) releaseSlotLocked(ref slotRef) {
	s := &rs.t.gpus[ref.g].slots[ref.u]
	s.res = nil
	if s.state == slotReserved {
		s.state = slotFree
	}
	rs.t.touchLocked(ref.g)
}

// activateLocked makes pending r active and records it; when the record
// cannot be written, r stays pending (holding its units) and the error says
// why.
func (rs *Reservations) activateLocked(r *reservation) error {
	if rs.failed != nil {
		return unsaved("the reservation stays pending", rs.failed)
	}
	r.active = true
	rs.pending--
	if err := rs.saveReservationsLocked(); err != nil {
		r.active = false
		rs.pending++
		return unsaved("the reservation stays pending", err)
	}
	rs.t.dirty = true
	return nil
}

// dropReservationLocked takes r out of the table and gives its units back;
// what its leases hold stays theirs. Its file record is the caller's.
func (rs *Reservations) dropReservationLocked(r *reservation) {
	for _, ref := range r.slots {
		rs.releaseSlotLocked(ref)
	}
	r.slots = nil
	// Its borrowers being taken back go on as plain leases: nobody needs
	// their units now, so the SIGKILL at the grace's end (killReclaimed) is
	// not sent.
	for id := range r.reclaiming {
		if l, ok := rs.t.leases[id]; ok && l.reclaiming {
			l.reclaiming = false
			rs.t.touchLocked(l.GPU.Index)
		}
	}
	delete(rs.byName, r.Name)
	if !r.active {
		rs.pending--
	}
}

// queueLocked lists the pending reservations in the order they are served.
func (rs *Reservations) queueLocked() []*reservation {
	var q []*reservation
	for _, r := range rs.byName {
		if !r.active {
			q = append(q, r)
		}
	}
	slices.SortFunc(q, func(a, b *reservation) int {
		if a.first(b) {
			return -1
		}
		return 1
	})
	return q
}

// admitLocked admits pending reservations, first in line first, while
// their units can be had, and holds for the first that cannot be admitted
// the units it could use.
func (rs *Reservations) admitLocked() {
	if rs.pending == 0 {
		return
	}
	for _, r := range rs.queueLocked() {
		choices, err := rs.placeReservationLocked(r)
		rs.holdLocked(r, choices)
		if err != nil {
			return
		}
		if err := rs.activateLocked(r); err != nil {
			return
		}
		rs.t.infoLocked("reservation admitted: its units are set aside", slog.String("reservation", r.Name),
			slog.Uint64("uid", uint64(r.owner.UID)), slog.Int("units", len(r.slots)))
	}
}

// Unreserve ends reservation name for peer (its owner or an admin): its
// units go back to the node. Leases drawn on it or borrowed from it go on as
// plain leases.
func (rs *Reservations) Unreserve(peer identity.Peer, name string) error {
	if !rs.t.lockOpen() {
		return errStopping
	}
	defer rs.t.unlock()
	r, err := rs.managedLocked(peer, name, "end")
	if err != nil {
		return err
	}
	return rs.endReservationLocked(r, "ended")
}

// managedLocked finds reservation name for peer to change.
func (rs *Reservations) managedLocked(peer identity.Peer, name, what string) (*reservation, error) {
	r, ok := rs.byName[name]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no reservation named %q", name)
	}
	if !mayManage(peer, r) {
		return nil, errdefs.Errorf(errdefs.ErrPermission, "reservation %q is uid %d's: only its owner and admins may %s it", name, r.owner.UID, what)
	}
	if rs.unread != nil {
		return nil, unsaved("the reservation is left as it is", rs.unread)
	}
	return r, nil
}

// endReservationLocked records that r ends, then gives its units back.
func (rs *Reservations) endReservationLocked(r *reservation, why string) error {
	delete(rs.byName, r.Name)
	if err := rs.saveReservationsLocked(); err != nil {
		rs.byName[r.Name] = r
		return unsaved("the reservation stays", err)
	}
	rs.byName[r.Name] = r
	rs.dropReservationLocked(r)
	rs.t.dirty = true
	rs.t.infoLocked("reservation "+why, slog.String("reservation", r.Name))
	rs.t.serveWaitersLocked()
	return nil
}

// unsaved is the error of a change refused because the reservations file
// cannot be written: nothing is promised that a restart could forget.
func unsaved(what string, err error) error {
	return errdefs.Errorf(errdefs.ErrUnavailable, "%s: the reservations file cannot be written: %v", what, err)
}
