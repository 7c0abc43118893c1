package agent

import (
	"slices"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/config"
)

// setLedgerAccess gives each GPU's instance folders in the pipe-file ledger
// the audience its pools give it, so that an offline claim is bound by the
// pools as a lease is: a GPU in no pool, or in a pool open to everyone, is
// open to the ledger's audience (the socket group); a GPU only in pools that
// name their users is open to those users and groups (of all such pools it
// is in, since a lease may use it through any of them), the admin group and
// root. A folder that cannot be set is logged and left closed or as it was.
func (a *Agent) setLedgerAccess(r *config.Rules) {
	adminGID := -1
	if r != nil && len(r.Pools) > 0 {
		adminGID = a.adminGID()
	}
	for _, d := range a.devs {
		acc := ledgerAccess(r, d.Index, adminGID)
		if err := a.ledger.SetAccess(d.Index, acc); err != nil {
			why := "offline claims on this GPU are not open to the ledger's audience as asked"
			if acc.Restricted {
				why = "offline claims on this GPU are not limited to its pools' users as asked"
			}
			a.log.Error(why, "gpu", d.Index, "err", err)
		}
	}
}

// ledgerAccess is who may claim GPU gpu offline under r.
func ledgerAccess(r *config.Rules, gpu, adminGID int) ledger.Access {
	var acc ledger.Access
	if r == nil {
		return acc
	}
	for _, p := range r.Pools {
		if !slices.Contains(p.GPUs, gpu) {
			continue
		}
		if p.Everyone {
			return ledger.Access{}
		}
		acc.Restricted = true
		acc.UIDs = append(acc.UIDs, p.UIDs...)
		acc.GIDs = append(acc.GIDs, p.GIDs...)
	}
	if acc.Restricted && adminGID >= 0 {
		acc.GIDs = append(acc.GIDs, uint32(adminGID))
	}
	return acc
}
