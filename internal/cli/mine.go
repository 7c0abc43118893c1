package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gpulet/gpulet/api"
)

// Free units that are not free to the caller: gpulet status's dots count
// every free unit, yet a unit on an instance whose MPS server serves another
// user, on a GPU of pools the caller may not use, or beyond the caller's
// quota is not one a lease of theirs can get.

// notForYou says, GPU by GPU and instance by instance, which free units uid
// cannot lease now and why.
func notForYou(s *api.Snapshot, pools *api.PoolList, quotas *api.QuotaList, uid uint32) []string {
	var notes []string
	names := owners{}
	for _, g := range s.GPUs {
		if g.UnitsFree == 0 {
			continue
		}
		if closed := closedPools(g.Index, pools); len(closed) > 0 {
			notes = append(notes, fmt.Sprintf("GPU %d: its %d free unit(s) are in pool %s, which you may not use", g.Index, g.UnitsFree, strings.Join(closed, ", ")))
			continue
		}
		for _, in := range g.Instances {
			if in.UnitsFree > 0 && in.UID != nil && *in.UID != uid {
				notes = append(notes, fmt.Sprintf("GPU %d instance %d: its %d free unit(s) are not yours now: its MPS server serves %s, and an MPS server serves one user at a time",
					g.Index, in.Instance, in.UnitsFree, names.name(*in.UID)))
			}
		}
	}
	if quotas != nil && !quotas.Admin {
		for _, q := range quotas.Quotas {
			if used := q.Held + q.Reserved; used >= q.Limit {
				notes = append(notes, fmt.Sprintf("quota %s: %d of its %d unit(s) are held: no free unit is yours until some are released", q.Quota, used, q.Limit))
			}
		}
	}
	return notes
}

// closedPools are the pools that hold GPU index when the caller may use none
// of them; nil when the GPU is in no pool or in one of the caller's.
func closedPools(index int, pools *api.PoolList) []string {
	if pools == nil {
		return nil
	}
	var closed []string
	for _, p := range pools.Pools {
		if !slices.Contains(p.GPUs, index) {
			continue
		}
		if p.Allowed {
			return nil
		}
		closed = append(closed, p.Name)
	}
	return closed
}

// writeNotForYou prints notForYou's lines under a heading, if any.
func writeNotForYou(w io.Writer, notes []string) {
	if len(notes) == 0 {
		return
	}
	fmt.Fprintln(w, "\nfree, but not for you:")
	for _, n := range notes {
		fmt.Fprintln(w, "  "+Printable(n))
	}
}
