// Package reserve is what a workflow reservation is, apart from the units it
// holds (docs/design.md §1.6 and §12): the request and its checks, the share
// group and who belongs to it, the stage arithmetic (how much to set aside,
// what a stage may lend, what a stage must take back), the split of units
// between share members by weight, and the file that keeps reservations
// across restarts and reboots. The lease engine owns the unit table and
// decides which units a reservation holds; nothing here touches units.
package reserve

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gpulet/gpulet/identity"
)

// Spec is a checked reservation request.
type Spec struct {
	Name string
	// Needs are the stages' units, in order; each is at least 1.
	Needs    []int
	Priority int
	// Share is the share group, in the order given.
	Share []Member
	// Wait queues the reservation when its units cannot be set aside now.
	Wait bool
}

// Size is what the reservation sets aside: the most any stage needs.
func (s *Spec) Size() int { return Size(s.Needs) }

// Size is the most any of needs needs: a workflow runs one stage at a time,
// so that much covers every stage.
func Size(needs []int) int {
	if len(needs) == 0 {
		return 0
	}
	return slices.Max(needs)
}

// Lendable is what a stage that needs need may lend of size units set aside.
func Lendable(size, need int) int { return max(size-need, 0) }

// ToReclaim is how many lent units a stage must take back when it starts:
// lent units not being taken back already beyond what the stage may lend.
// Worked example (docs/design.md §1.6): size 8, stages 2, 6, 6, 8, borrowers taking
// every lendable unit: 0, 4, 0, 2.
func ToReclaim(size, need, lent int) int { return max(lent-Lendable(size, need), 0) }

// Member is one member of a share group: a user or a group, resolved to its
// id when the reservation was made, so that a later rename of the name
// changes nothing.
type Member struct {
	// Name is as the request gave it: "bob" or "group:ml".
	Name  string `json:"name"`
	Group bool   `json:"group,omitempty"`
	// ID is the uid, or the gid of a group.
	ID uint32 `json:"id"`
	// Weight is the member's share; 0 when the group gives no weights.
	Weight int `json:"weight,omitempty"`
}

// Principal is the member as identity knows it, its ID as resolved.
func (m Member) Principal() identity.Principal {
	name, kind := m.Name, identity.User
	if m.Group {
		name, kind = strings.TrimPrefix(name, identity.GroupPrefix), identity.Group
	}
	// A number is the id itself, as in the config file and chown.
	if id, err := strconv.ParseUint(name, 10, 32); err == nil {
		return identity.Principal{Kind: kind, Name: name, ByID: true, ID: uint32(id)}
	}
	return identity.Principal{Kind: kind, Name: name, ID: m.ID}
}

// MemberOf is the first member of share the caller is, by identity's rule,
// or -1: a caller who is several members (a user and one of its groups)
// borrows as the first listed.
func MemberOf(share []Member, uid, gid uint32, groups []uint32) int {
	gids := identity.GroupsOf(gid, groups)
	for i, m := range share {
		if m.Principal().Matches(uid, gids) {
			return i
		}
	}
	return -1
}

// Weighted reports whether share gives weights (then every member has one).
func Weighted(share []Member) bool { return len(share) > 0 && share[0].Weight > 0 }

// Caps is the most each member of share may borrow of lendable units: with
// weights, its share of them, split by weight; without weights, all of them,
// first come, first served (the caller bounds the sum by what is lendable).
func Caps(lendable int, share []Member) []int {
	caps := make([]int, len(share))
	if !Weighted(share) {
		for i := range caps {
			caps[i] = lendable
		}
		return caps
	}
	return apportion(lendable, share, nil)
}

// Reclaim splits k units to take back between the members of share, who
// hold held[i] units each: in proportion to the weights, no member giving
// more than it holds; without weights, the first listed gives first. It
// takes back min(k, sum of held).
func Reclaim(k int, held []int, share []Member) []int {
	if !Weighted(share) {
		out := make([]int, len(share))
		for i := range out {
			n := min(k, held[i])
			out[i], k = n, k-n
		}
		return out
	}
	return apportion(k, share, held)
}

// apportion splits n units by the members' weights, largest remainder
// first (ties to the first listed), so that each member's part is within one
// unit of its exact proportion; the same rule lends and takes back. A member
// whose part would pass limit[i] gets limit[i], and the rest is split again
// among the others (nil: no limits).
func apportion(n int, share []Member, limit []int) []int {
	got := make([]int, len(share))
	var open []int
	for i := range share {
		if limit == nil || limit[i] > 0 {
			open = append(open, i)
		}
	}
	for n > 0 && len(open) > 0 {
		w := 0
		for _, i := range open {
			w += share[i].Weight
		}
		part := make([]int, len(open))
		rem := make([]int, len(open))
		left := n
		for j, i := range open {
			part[j], rem[j] = n*share[i].Weight/w, n*share[i].Weight%w
			left -= part[j]
		}
		order := make([]int, len(open))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int { return rem[b] - rem[a] })
		for _, j := range order[:left] {
			part[j]++
		}
		var still []int
		for j, i := range open {
			if limit != nil && got[i]+part[j] >= limit[i] {
				n -= limit[i] - got[i]
				got[i] = limit[i]
				continue
			}
			still = append(still, i)
		}
		if len(still) == len(open) {
			for j, i := range open {
				got[i] += part[j]
			}
			break
		}
		open = still
	}
	return got
}
