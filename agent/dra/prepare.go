package dra

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// PrepareResourceClaims leases what the scheduler allocated to each claim on
// this node, exactly (that GPU, that instance, those units and memory), and
// writes the CDI spec that gives its containers the lease. Asked again (the
// kubelet retrying, or restarted, or gpuletd restarted) it answers the same
// leases. A claim that cannot be honoured now (its units were taken outside
// Kubernetes since, another user holds the instance) fails with the reason:
// the kubelet reports it in the pod's events and tries again, and the pod
// never runs on units it does not hold.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, err := d.prepare(ctx, c)
		if err != nil {
			d.cfg.Logger.Warn("DRA driver: claim not prepared", "claim", c.Namespace+"/"+c.Name, "err", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("%s cannot prepare claim %s/%s: %w", DriverName, c.Namespace, c.Name, err)}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("it is not allocated")
	}
	uid, gid, pod, err := d.claimUser(ctx, c)
	if err != nil {
		return nil, err
	}
	var devs []kubeletplugin.Device
	var specs []cdiDevice
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName || r.Pool != d.cfg.NodeName {
			continue
		}
		share, err := shareOf(c, r, uid, gid, pod)
		if err != nil {
			d.cfg.Claims.EndClaim(string(c.UID), "its claim could not be prepared")
			return nil, err
		}
		g, _, err := d.cfg.Claims.GrantClaim(share)
		if err != nil {
			d.cfg.Claims.EndClaim(string(c.UID), "its claim could not be prepared")
			return nil, fmt.Errorf("device %s: %w", r.Device, err)
		}
		name := cdiDeviceName(string(c.UID), r.Device, share.Claim.Share)
		specs = append(specs, cdiDevice{Name: name, Edits: containerEdits(g.Lease)})
		devs = append(devs, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{CDIKind + "=" + name}, ShareID: r.ShareID,
		})
	}
	if err := writeCDISpec(d.cfg.CDIDir, string(c.UID), specs); err != nil {
		d.cfg.Claims.EndClaim(string(c.UID), "its claim's CDI spec could not be written")
		return nil, err
	}
	return devs, nil
}

// shareOf is the lease request for one allocated device of claim c.
func shareOf(c *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, uid, gid uint32, pod string) (lease.ClaimShare, error) {
	gpu, instance, err := ParseDevice(r.Device)
	if err != nil {
		return lease.ClaimShare{}, err
	}
	s := lease.ClaimShare{
		Claim: api.LeaseClaim{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID), Device: r.Device, Pod: pod},
		GPU:   gpu, Instance: instance, UID: uid, GID: gid,
	}
	if r.ShareID != nil {
		s.Claim.Share = string(*r.ShareID)
	}
	if instance < 0 {
		return s, nil
	}
	units, ok := r.ConsumedCapacity["units"]
	if !ok {
		return s, fmt.Errorf("device %s: the allocation says no units consumed (is the DRAConsumableCapacity feature off in the scheduler?)", r.Device)
	}
	n, ok := units.AsInt64()
	if !ok || n < 1 || n > 1<<20 {
		return s, fmt.Errorf("device %s: %s units is not a count of units", r.Device, units.String())
	}
	s.Units = int(n)
	if mem, ok := r.ConsumedCapacity["memory"]; ok {
		b, ok := mem.AsInt64()
		if !ok || b < 0 {
			return s, fmt.Errorf("device %s: memory %s is not a size", r.Device, mem.String())
		}
		s.MemoryMiB = uint64(b+(1<<20)-1) >> 20
	}
	return s, nil
}

// claimUser is the user an MPS server must serve for claim c: the uid and
// gid its pod's containers run as (runAsUser, runAsGroup), and the pod's
// name. A container without runAsUser runs as its image says, which the
// driver cannot see: it counts as root, and so shares no instance with a
// user who sets one.
func (d *Driver) claimUser(ctx context.Context, c *resourceapi.ResourceClaim) (uid, gid uint32, pod string, err error) {
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" {
			continue
		}
		p, err := d.client.CoreV1().Pods(c.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return 0, 0, "", fmt.Errorf("its pod %s/%s: %w", c.Namespace, ref.Name, err)
		}
		if p.UID != ref.UID {
			return 0, 0, "", fmt.Errorf("its pod %s/%s is not the one it was allocated for", c.Namespace, ref.Name)
		}
		uid, gid, err := podUser(p, c)
		return uid, gid, c.Namespace + "/" + ref.Name, err
	}
	return 0, 0, "", fmt.Errorf("no pod is reserved for it")
}

// podUser is the one uid and gid of the containers of p that use claim c.
func podUser(p *corev1.Pod, c *resourceapi.ResourceClaim) (uid, gid uint32, err error) {
	var podUID, podGID *int64
	if sc := p.Spec.SecurityContext; sc != nil {
		podUID, podGID = sc.RunAsUser, sc.RunAsGroup
	}
	names := claimNamesOf(p, c)
	first := true
	for _, ct := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		if !usesClaim(ct, names) {
			continue
		}
		u, g := podUID, podGID
		if sc := ct.SecurityContext; sc != nil {
			if sc.RunAsUser != nil {
				u = sc.RunAsUser
			}
			if sc.RunAsGroup != nil {
				g = sc.RunAsGroup
			}
		}
		cu, cg := uint32(0), uint32(0)
		if u != nil {
			cu = uint32(*u)
		}
		if g != nil {
			cg = uint32(*g)
		}
		if !first && (cu != uid || cg != gid) {
			return 0, 0, fmt.Errorf("the containers of pod %s/%s that use it run as uids %d and %d: an MPS server serves one user", p.Namespace, p.Name, uid, cu)
		}
		uid, gid, first = cu, cg, false
	}
	return uid, gid, nil
}

// claimNamesOf are the names by which p's containers refer to claim c.
func claimNamesOf(p *corev1.Pod, c *resourceapi.ResourceClaim) map[string]bool {
	names := map[string]bool{}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil && *s.ResourceClaimName == c.Name {
			names[s.Name] = true
		}
	}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil && *rc.ResourceClaimName == c.Name {
			names[rc.Name] = true
		}
	}
	return names
}

func usesClaim(ct corev1.Container, names map[string]bool) bool {
	for _, r := range ct.Resources.Claims {
		if names[r.Name] {
			return true
		}
	}
	return false
}

// UnprepareResourceClaims ends the leases of each claim and removes its CDI
// spec. A claim prepared by no one (or unprepared before) is no error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		n := d.cfg.Claims.EndClaim(string(c.UID), "the kubelet unprepared its ResourceClaim")
		err := removeCDISpec(d.cfg.CDIDir, string(c.UID))
		if n > 0 {
			d.cfg.Logger.Info("DRA driver: claim unprepared", "claim", c.Namespace+"/"+c.Name, "leases", n)
		}
		out[c.UID] = err
	}
	return out, nil
}
