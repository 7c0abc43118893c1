package lease

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// This file is the table's side of Kubernetes' Dynamic Resource Allocation:
// leases of kind claim, which the DRA driver (agent/dra) makes when the
// kubelet prepares a ResourceClaim the scheduler allocated on this node, and
// ends when the kubelet unprepares it. Unlike a pod lease, the scheduler has
// already chosen the GPU and the MPS instance; the table picks the units.

// KindClaim: the lease ends when the kubelet unprepares its ResourceClaim;
// the DRA driver ends it (EndClaim).
const KindClaim Kind = "claim"

// claimBinding holds nothing: the kubelet's unprepare ends the lease.
type claimBinding struct{}

func (claimBinding) kind() Kind                 { return KindClaim }
func (claimBinding) armLocked(*Manager, *lease) {}
func (claimBinding) release()                   {}

// Claims is the claim-lease feature: what the DRA driver calls. Like Pods it
// keeps no state of its own: a claim lease carries its claim (api.LeaseClaim)
// and is journaled like any lease, so prepared claims outlive restarts.
type Claims struct{ t *Manager }

// Claims is the table's claim-lease feature.
func (m *Manager) Claims() *Claims { return &Claims{t: m} }

// ClaimShare is one allocated device of a ResourceClaim, as the driver asks
// the table to lease it.
type ClaimShare struct {
	Claim api.LeaseClaim
	// GPU is the GPU's index on the node; Instance its MPS instance, or -1
	// for the whole GPU (every unit, no MPS client).
	GPU, Instance int
	// Units and MemoryMiB are what the scheduler counted for the share.
	Units     int
	MemoryMiB uint64
	// UID and GID are the pod's user: an MPS server serves one user, so the
	// placement engine's one-user rule binds claims as it binds gpurun.
	UID, GID uint32
}

// GrantClaim leases share: exactly that GPU and instance, the units the
// placement engine picks there (the same conditions as any lease: the GPU
// eligible, the instance up and serving no other user, memory held). Asked
// again for the same claim and device (the kubelet retrying, or restarted),
// it answers the lease it made before; reused says so. Pools and quotas of
// gpulet do not bind claims: Kubernetes decides what runs on the node and
// has quotas of its own.
func (c *Claims) GrantClaim(share ClaimShare) (g Grant, reused bool, err error) {
	if share.Claim.UID == "" || share.Claim.Device == "" {
		return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "a claim share needs its claim's uid and its device")
	}
	whole := share.Instance < 0
	if !whole && share.Units < 1 {
		return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "claim %s/%s asks no units of device %s", share.Claim.Namespace, share.Claim.Name, share.Claim.Device)
	}
	if !c.t.lockOpen() {
		return Grant{}, false, errStopping
	}
	defer c.t.unlock()
	if l := c.leaseOfLocked(share.Claim); l != nil {
		return l.grant(), true, nil
	}
	if share.GPU < 0 || share.GPU >= len(c.t.gpus) || !whole && share.Instance >= c.t.cfg.Model.InstancesPerGPU {
		return Grant{}, false, errdefs.Errorf(errdefs.ErrInvalid, "no GPU %d, instance %d on this node", share.GPU, share.Instance)
	}
	if c.t.journal.Failed() != nil {
		return Grant{}, false, unrecorded("no lease is granted", c.t.journal.Failed())
	}
	peer := identity.Peer{UID: share.UID, GID: share.GID, Admin: true}
	req := Request{LeaseRequest: api.LeaseRequest{Units: share.Units, MemoryMiB: share.MemoryMiB, GPU: strconv.Itoa(c.t.gpus[share.GPU].dev.Index)}}
	if whole {
		// A request of whole GPUs names none: the view has only GPU g open.
		req.Units, req.GPUs, req.GPU = 0, 1, ""
	}
	pr := c.t.placementRequest(peer, req)
	d, err := c.t.engine.Load().Place(c.onlyLocked(share.GPU, share.Instance), pr)
	if err != nil {
		return Grant{}, false, err
	}
	ch := d.Choice
	if ch.GPU != share.GPU {
		// Cannot happen: only that GPU is open in the view handed over.
		return Grant{}, false, fmt.Errorf("placement chose GPU %d, not the %d allocated", ch.GPU, share.GPU)
	}
	retry, err := c.t.fifos.createChoiceLocked(ch)
	if err != nil {
		return Grant{}, false, err
	}
	if retry {
		return Grant{}, false, errdefs.Errorf(errdefs.ErrNoCapacity, "a unit of GPU %d was claimed outside Kubernetes just now", share.GPU)
	}
	l := c.t.newLease(peer, req, claimBinding{}, ch, nil)
	cl := share.Claim
	// Set in place: nothing holds the new lease's value yet.
	l.Lease.Claim = &cl
	c.t.addLocked(l)
	if err := c.t.rec.recordLocked(journal.Record{Op: journal.OpLease, Entry: l.entry(nil)}); err != nil {
		c.t.dropLocked(l)
		return Grant{}, false, unrecorded("the lease is not granted", err)
	}
	c.t.granted++
	if c.t.lines.due() {
		c.t.infoLocked("lease granted", slog.String("lease", l.ID), slog.Int("gpu", d.Choice.GPU), slog.Int("instance", d.Choice.Instance),
			slog.Any("units", d.Choice.Units), slog.String("binding", string(KindClaim)),
			slog.String("claim", share.Claim.Namespace+"/"+share.Claim.Name), slog.String("device", share.Claim.Device))
	}
	return l.grant(), false, nil
}

// leaseOfLocked is the lease made for the claim's device (and share), if any.
func (c *Claims) leaseOfLocked(cl api.LeaseClaim) *lease {
	for _, l := range c.t.leases {
		if l.Claim != nil && l.Claim.UID == cl.UID && l.Claim.Device == cl.Device && l.Claim.Share == cl.Share {
			return l
		}
	}
	return nil
}

// onlyLocked is the placement view of the node with only instance k of GPU g
// open (k < 0: the whole GPU g): the scheduler chose it.
func (c *Claims) onlyLocked(g, k int) *placement.Node {
	base := c.t.pub.nodeLocked()
	n := *base
	n.GPUs = slices.Clone(base.GPUs)
	for gi := range n.GPUs {
		if gi == g && k < 0 {
			continue
		}
		gpu := n.GPUs[gi]
		gpu.Instances = slices.Clone(gpu.Instances)
		for ki := range gpu.Instances {
			if gi != g || ki != k {
				gpu.Instances[ki].Down = "not the device the scheduler allocated"
			}
		}
		n.GPUs[gi] = gpu
	}
	return &n
}

// EndClaim ends every lease made for the ResourceClaim of that uid and says
// how many it ended. Like a holder's exit, the end happens even when it
// cannot be recorded.
func (c *Claims) EndClaim(uid, reason string) int {
	if !c.t.lockOpen() {
		return 0
	}
	defer c.t.unlock()
	n := 0
	for _, l := range c.t.leases {
		if l.Claim != nil && l.Claim.UID == uid {
			c.t.dropAndRecordLocked(l, reason, true)
			n++
		}
	}
	if n > 0 {
		c.t.serveWaitersLocked()
	}
	return n
}
