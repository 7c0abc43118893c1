package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// TestRandomOperationsKeepTheTableInStep drives one Manager through a long
// random mix of what happens to a node — grants bound to time, to
// processes and to pods, renewals, releases, pods ending, offline claims
// coming and going, reservations made and ended, probes and restarts — and
// after every step checks what must always hold: the
// published view is what the table says, every leased unit has its FIFO, no
// unit is in two leases or two reservations, and each process's count of
// units is its leases'.
func TestRandomOperationsKeepTheTableInStep(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { randomOperations(t, seed) })
	}
}

func randomOperations(t *testing.T, seed uint64) {
	f := newFixture(t, 2, 3, 2) // U = 12 per GPU, 2 GPUs
	m := f.manager(t)
	var procs []*exec.Cmd
	for range 3 {
		cmd := exec.Command("sleep", "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		procs = append(procs, cmd)
	}
	type claim struct{ g, u, fd int }
	var claims []claim
	t.Cleanup(func() {
		for _, c := range claims {
			unix.Close(c.fd)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 2))
	granted, podGranted, restarts := 0, 0, 0
	ctx := context.Background()
	for step := range 600 {
		what := ""
		switch op := rng.IntN(135); {
		case op >= 130:
			// Reservations, pending ones too, hold units beside the leases.
			s := reserve.Spec{Name: fmt.Sprint("wf", rng.IntN(4)), Needs: []int{1 + rng.IntN(4)}, Wait: rng.IntN(2) == 0}
			what = fmt.Sprintf("reserve %+v", s)
			_, err := m.Reservations().Reserve(root, s)
			if err != nil && !errors.Is(err, api.ErrInsufficientUnits) && !errors.Is(err, api.ErrConflict) {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
		case op >= 125:
			what = "unreserve"
			for _, r := range m.View().Reservations {
				what = "unreserve " + r.Name
				if err := m.Reservations().Unreserve(root, r.Name); err != nil {
					t.Fatalf("step %d, %s: %v", step, what, err)
				}
				break
			}
		case op >= 105:
			// The kubelet allocates 1 or 2 units of one instance: mostly
			// free ones, as it allocates healthy devices, else any (a pod
			// lease's it gives again, or one taken meanwhile).
			g, u := rng.IntN(2), rng.IntN(f.model.UnitsPerGPU)
			if free := m.View().GPUs[g].Instances[rng.IntN(f.model.InstancesPerGPU)].FreeUnits; len(free) > 0 && rng.IntN(4) > 0 {
				u = free[rng.IntN(len(free))]
			}
			us := []Unit{{g, u}}
			if v := u + 1; rng.IntN(2) == 0 && v < f.model.UnitsPerGPU && f.model.InstanceOf(v) == f.model.InstanceOf(u) {
				us = append(us, Unit{g, v})
			}
			what = fmt.Sprintf("pod grant %v", us)
			_, _, err := m.Pods().GrantPod(us, api.LeasePod{Devices: []string{"d"}})
			if err != nil && !errors.Is(err, api.ErrInsufficientUnits) {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
			if err == nil {
				podGranted++
			}
		case op >= 100:
			var pods []string
			for _, l := range m.List(root) {
				if l.Binding == "pod" {
					pods = append(pods, l.ID)
				}
			}
			if len(pods) == 0 {
				continue
			}
			id := pods[rng.IntN(len(pods))]
			what = "pod gone " + id
			if !m.Pods().EndPod(id, "pod gone") {
				t.Fatalf("step %d, %s: not ended", step, what)
			}
		case op < 30:
			req := ttlReq(1+rng.IntN(2), "1h")
			if rng.IntN(3) == 0 {
				req.GPU = fmt.Sprint(rng.IntN(2))
			}
			what = fmt.Sprintf("ttl grant %+v", req.LeaseRequest)
			_, err := m.Acquire(ctx, root, req)
			if err != nil && !errors.Is(err, api.ErrInsufficientUnits) {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
			if err == nil {
				granted++
			}
		case op < 45:
			p := procs[rng.IntN(len(procs))]
			what = fmt.Sprintf("process grant for %d", p.Process.Pid)
			_, err := m.Acquire(ctx, root, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: p.Process.Pid}})
			if err != nil && !errors.Is(err, api.ErrInsufficientUnits) && !errors.Is(err, api.ErrBadRequest) {
				t.Fatalf("step %d, %s: %v", step, what, err)
			}
		case op < 70:
			ls := m.List(root)
			if len(ls) == 0 {
				continue
			}
			l := ls[rng.IntN(len(ls))]
			if l.TTL != "" && rng.IntN(3) == 0 {
				what = "renew " + l.ID
				if _, err := m.Renew(root, l.ID); err != nil {
					t.Fatalf("step %d, %s: %v", step, what, err)
				}
			} else {
				what = "release " + l.ID
				if err := m.Release(root, l.ID); err != nil {
					t.Fatalf("step %d, %s: %v", step, what, err)
				}
			}
		case op < 82:
			g, u := rng.IntN(2), rng.IntN(f.model.UnitsPerGPU)
			if f.ledger.Present(g, u) {
				continue
			}
			what = fmt.Sprintf("offline claim of GPU %d unit %d", g, u)
			claims = append(claims, claim{g, u, claimOffline(t, f, g, u)})
		case op < 92:
			if len(claims) == 0 {
				continue
			}
			i := rng.IntN(len(claims))
			what = fmt.Sprintf("claim of GPU %d unit %d let go", claims[i].g, claims[i].u)
			unix.Close(claims[i].fd)
			claims = slices.Delete(claims, i, i+1)
		case op < 97:
			what = "probe"
			m.probeOffline()
		default:
			what = "restart"
			m.Close()
			m = f.manager(t)
			restarts++
		}
		checkInvariants(t, m, fmt.Sprintf("step %d (%s)", step, what))
	}
	// How many pod grants find their units free depends on timing, chiefly
	// on when the ledger watch counts the offline claims: 9 to 25 for seed 2
	// in 40 quiet runs, once 4 under make test's load. At least 3 still
	// shows the path taken.
	if granted < 40 || podGranted < 3 || restarts == 0 {
		t.Fatalf("the mix did too little: %d ttl grants, %d pod grants, %d restarts", granted, podGranted, restarts)
	}
	// The watch catches up: every claim still held is counted, and only those.
	m.probeOffline()
	want := len(claims)
	var got int
	for deadline := 0; deadline < 500; deadline++ {
		v := m.View()
		if got = v.GPUs[0].Offline + v.GPUs[1].Offline; got == want {
			break
		}
		m.probeOffline()
		sleepBriefly()
	}
	if got != want {
		t.Fatalf("%d offline units counted at the end, want the %d claims held", got, want)
	}
}

// checkInvariants checks, under the Manager's lock, what must hold between
// any two operations.
func checkInvariants(t *testing.T, m *Manager, when string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pub.publishLocked()
	v := m.view.Load()
	held := map[procKey]int{}
	for gi, g := range m.gpus {
		fresh := m.pub.buildGPUViewLocked(gi, g)
		pub := v.GPUs[gi]
		if fresh.Used != pub.Used || fresh.Reserved != pub.Reserved || fresh.Offline != pub.Offline || fresh.LeasesHere != pub.LeasesHere || fmt.Sprint(fresh.OfflineByUID) != fmt.Sprint(pub.OfflineByUID) ||
			instancesOf(fresh.Instances) != instancesOf(pub.Instances) || fmt.Sprint(leaseIDsOf(fresh.Leases)) != fmt.Sprint(leaseIDsOf(pub.Leases)) {
			t.Fatalf("%s: GPU %d's published view %+v differs from its table %+v", when, gi, pub, fresh)
		}
		for u, s := range g.slots {
			if r := s.res; r != nil && (m.res.byName[r.Name] != r || !slices.Contains(r.slots, slotRef{gi, u})) {
				t.Fatalf("%s: GPU %d unit %d is marked with reservation %s, which does not hold it", when, gi, u, r.Name)
			}
			if s.state == slotReserved && s.res == nil {
				t.Fatalf("%s: GPU %d unit %d is reserved for no reservation", when, gi, u)
			}
			if s.state != slotLeased {
				continue
			}
			if !slices.Contains(s.lease.Units, u) || s.lease.GPU.Index != gi || m.leases[s.lease.ID] != s.lease {
				t.Fatalf("%s: GPU %d unit %d points at lease %s, which does not hold it", when, gi, u, s.lease.ID)
			}
			if l := s.lease; l.gpu != l.GPU.Index || l.ownerUID != l.Owner.UID || l.slurm != l.Slurm {
				t.Fatalf("%s: lease %s keeps GPU %d, owner %d, Slurm %v; it is on GPU %d, owned by %d, Slurm %v", when, l.ID, l.gpu, l.ownerUID, l.slurm, l.GPU.Index, l.Owner.UID, l.Slurm)
			}
			if !m.cfg.Ledger.Present(gi, u) {
				t.Fatalf("%s: GPU %d unit %d is leased to %s but has no FIFO", when, gi, u, s.lease.ID)
			}
		}
	}
	for _, r := range m.res.byName {
		for _, ref := range r.slots {
			if m.gpus[ref.g].slots[ref.u].res != r {
				t.Fatalf("%s: reservation %s holds GPU %d unit %d, which the table does not mark with it", when, r.Name, ref.g, ref.u)
			}
		}
	}
	for id, l := range m.leases {
		for _, u := range l.Units {
			if s := m.gpus[l.GPU.Index].slots[u]; s.state != slotLeased || s.lease != l {
				t.Fatalf("%s: lease %s holds GPU %d unit %d, which the table does not give it", when, id, l.GPU.Index, u)
			}
		}
		if l.holder != nil {
			held[*l.holder] += len(l.Units)
		}
	}
	want := newQuotaUse()
	for _, l := range m.leases {
		want.add(l.Owner.UID, identity.GroupsOf(l.Owner.GID, l.Owner.Groups), len(l.Units))
	}
	for _, g := range m.gpus {
		for _, s := range g.slots {
			if s.state == slotOffline {
				want.add(s.uid, nil, 1)
			}
		}
	}
	if fmt.Sprint(want) != fmt.Sprint(m.quotaUse) {
		t.Fatalf("%s: units counted against quotas %+v, the table says %+v", when, m.quotaUse, want)
	}
	if fmt.Sprint(held) != fmt.Sprint(m.held) {
		t.Fatalf("%s: units held per process %v, the leases say %v", when, m.held, held)
	}
	for k, n := range held {
		if n > m.cfg.Model.UnitsPerClient {
			t.Fatalf("%s: process %d holds %d units, more than M", when, k.pid, n)
		}
	}
}

// instancesOf writes instances out with their uid's value, not its address.
func instancesOf(ins []InstanceView) string {
	out := ""
	for _, in := range ins {
		uid := "-"
		if in.UID != nil {
			uid = fmt.Sprint(*in.UID)
		}
		out += fmt.Sprintf("{free %v size %d clients %d uid %s users %v}", in.FreeUnits, in.Size, in.Clients, uid, in.Users)
	}
	return out
}

func leaseIDsOf(ls []*api.Lease) []string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	slices.Sort(ids)
	return ids
}

func sleepBriefly() { time.Sleep(10 * time.Millisecond) }
