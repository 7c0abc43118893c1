package identity

import "slices"

// Set is whom a pool is open to: everyone, or the users UIDs and the members
// of the groups GIDs (both sorted, each once).
type Set struct {
	Everyone bool
	UIDs     []uint32
	GIDs     []uint32
}

// Allows says whether a caller of uid in the groups gids (its primary group
// and its supplementary ones) is in the set.
func (s *Set) Allows(uid uint32, gids []uint32) bool {
	if s.Everyone {
		return true
	}
	if _, ok := slices.BinarySearch(s.UIDs, uid); ok {
		return true
	}
	for _, g := range gids {
		if _, ok := slices.BinarySearch(s.GIDs, g); ok {
			return true
		}
	}
	return false
}

// Matches says whether a caller of uid in the groups gids is the principal,
// whose ID is resolved (ByID, or looked up): the user itself, a member of
// the group, or anyone for Everyone.
func (p Principal) Matches(uid uint32, gids []uint32) bool {
	switch p.Kind {
	case User:
		return p.ID == uid
	case Group:
		return slices.Contains(gids, p.ID)
	case Everyone:
		return true
	}
	return false
}

// Index answers Allows for many sets at once in a few lookups per caller,
// not a search of every set's members: placement asks it on every lease, for
// every pool.
type Index struct {
	everyone     []int
	byUID, byGID map[uint32][]int
}

// NewIndex indexes sets by position.
func NewIndex(sets []*Set) Index {
	ix := Index{byUID: map[uint32][]int{}, byGID: map[uint32][]int{}}
	for i, s := range sets {
		if s.Everyone {
			ix.everyone = append(ix.everyone, i)
		}
		for _, u := range s.UIDs {
			ix.byUID[u] = append(ix.byUID[u], i)
		}
		for _, g := range s.GIDs {
			ix.byGID[g] = append(ix.byGID[g], i)
		}
	}
	return ix
}

// Mark sets allowed[i] for every set i that allows a caller of uid in the
// groups gids, as Set.Allows would; it clears nothing.
func (ix Index) Mark(allowed []bool, uid uint32, gids []uint32) {
	for _, i := range ix.everyone {
		allowed[i] = true
	}
	for _, i := range ix.byUID[uid] {
		allowed[i] = true
	}
	for _, g := range gids {
		for _, i := range ix.byGID[g] {
			allowed[i] = true
		}
	}
}
