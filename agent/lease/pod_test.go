package lease

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

func unitsOf(g int, idx ...int) []Unit {
	out := make([]Unit, len(idx))
	for i, u := range idx {
		out[i] = Unit{GPU: g, Index: u}
	}
	return out
}

func podOf(devices ...string) api.LeasePod { return api.LeasePod{Devices: devices} }

func TestGrantPodLeasesExactlyTheUnitsAsked(t *testing.T) {
	f := newFixture(t, 2, 4, 2) // M=2; 16 units per GPU, instances {0-7} and {8-15}
	m := f.manager(t)
	g, reused, err := m.Pods().GrantPod(unitsOf(1, 10, 9), podOf("a", "b"))
	if err != nil || reused {
		t.Fatalf("GrantPod: %v (reused %v)", err, reused)
	}
	if g.Binding != "pod" || g.GPU.Index != 1 || g.Instance != 1 || !slices.Equal(g.Units, []int{9, 10}) {
		t.Fatalf("lease %+v", g.Lease)
	}
	if !reflect.DeepEqual(g.Owner, api.Owner{}) || g.Expires != nil || g.Pod == nil || !slices.Equal(g.Pod.Devices, []string{"a", "b"}) {
		t.Fatalf("owner %+v expires %v pod %+v", g.Owner, g.Expires, g.Pod)
	}
	if g.Env["CUDA_VISIBLE_DEVICES"] != f.devs[1].UUID || g.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" {
		t.Fatalf("env %v", g.Env)
	}
	if n := f.fifoCount(t, 1); n != 2 || !f.ledger.Present(1, 9) || !f.ledger.Present(1, 10) {
		t.Fatalf("%d FIFOs on GPU 1", n)
	}
	if ls := m.View().Leases(); len(ls) != 1 || ls[0].ID != g.ID {
		t.Fatalf("view leases %v", ls)
	}
	// The same units again are the same lease: the kubelet asking twice.
	again, reused, err := m.Pods().GrantPod(unitsOf(1, 9, 10), podOf("a", "b"))
	if err != nil || !reused || again.ID != g.ID {
		t.Fatalf("second GrantPod: %v reused %v id %s, want %s", err, reused, again.ID, g.ID)
	}
}

func TestGrantPodRefusals(t *testing.T) {
	f := newFixture(t, 2, 4, 2)
	m := f.manager(t)
	ttl, err := m.Acquire(context.Background(), root, Request{LeaseRequest: api.LeaseRequest{Units: 1, GPU: "0"}, TTL: ttlReq(1, "1m").TTL})
	if err != nil {
		t.Fatal(err)
	}
	fd := claimOffline(t, f, 1, 0)
	defer unix.Close(fd)
	testutil.Eventually(t, "the offline claim counted", func() bool { return m.View().GPUs[1].Offline == 1 })
	for _, c := range []struct {
		name  string
		units []Unit
		want  error
		says  string
	}{
		{"none", nil, api.ErrBadRequest, "no devices"},
		{"more than M", unitsOf(0, 4, 5, 6), api.ErrBadRequest, "--units-per-client"},
		{"two GPUs", []Unit{{0, 4}, {1, 4}}, api.ErrBadRequest, "one GPU"},
		{"two instances", unitsOf(0, 7, 8), api.ErrBadRequest, "one instance"},
		{"twice", unitsOf(0, 4, 4), api.ErrBadRequest, "named twice"},
		{"no such GPU", unitsOf(7, 1), api.ErrBadRequest, "no unit 1 on GPU 7"},
		{"no such unit", unitsOf(0, 16), api.ErrBadRequest, "no unit 16"},
		{"leased by gpurun", unitsOf(0, ttl.Units[0]), api.ErrInsufficientUnits, "held by lease " + ttl.ID},
		{"claimed offline", unitsOf(1, 0), api.ErrInsufficientUnits, "claimed offline by uid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := m.Pods().GrantPod(c.units, podOf())
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v, want %v saying %q", err, c.want, c.says)
			}
		})
	}
	m.SetConditions(&Conditions{GPUs: []GPUCondition{{Unusable: "is 95% busy"}, {}}})
	if _, _, err := m.Pods().GrantPod(unitsOf(0, 12), podOf()); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "95% busy") {
		t.Fatalf("busy GPU: %v", err)
	}
	// What already runs is recorded whatever the GPU's state.
	if _, err := m.Pods().AdoptPod(unitsOf(0, 12), podOf()); err != nil {
		t.Fatalf("AdoptPod on a busy GPU: %v", err)
	}
	if _, err := m.Pods().AdoptPod(unitsOf(1, 0), podOf()); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("AdoptPod of an offline claim: %v", err)
	}
	if got := len(m.View().Leases()); got != 2 {
		t.Fatalf("%d leases after the refusals, want 2", got)
	}
}

func TestGrantPodSupersedesAPodLeaseTheKubeletGivesAgain(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m := f.manager(t)
	old, _, err := m.Pods().GrantPod(unitsOf(0, 2, 3), podOf())
	if err != nil {
		t.Fatal(err)
	}
	g, reused, err := m.Pods().GrantPod(unitsOf(0, 3, 4), podOf())
	if err != nil || reused {
		t.Fatalf("GrantPod: %v reused %v", err, reused)
	}
	ls := m.View().Leases()
	if len(ls) != 1 || ls[0].ID != g.ID || !slices.Equal(ls[0].Units, []int{3, 4}) {
		t.Fatalf("leases %+v; want only the new one", ls)
	}
	if _, err := m.Get(root, old.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("superseded lease still there: %v", err)
	}
	if f.ledger.Present(0, 2) || !f.ledger.Present(0, 3) || !f.ledger.Present(0, 4) {
		t.Fatal("pipe files do not follow the leases")
	}
	if v := m.View(); v.Granted != 2 || v.Ended != 1 {
		t.Fatalf("granted %d ended %d", v.Granted, v.Ended)
	}
}

func TestPreferPodAsksThePlacementEngine(t *testing.T) {
	f := newFixture(t, 2, 4, 2) // 16 units per GPU, instances {0-7} and {8-15}
	m := f.manager(t)
	// GPU 1's instance 1 has one unit taken: best fit prefers the fuller
	// GPU, and its tightest instance that fits two.
	if _, _, err := m.Pods().GrantPod(unitsOf(1, 12), podOf()); err != nil {
		t.Fatal(err)
	}
	before := m.View().Version
	var all []Unit
	for i := range 16 {
		all = append(all, Unit{0, i})
		if i != 12 {
			all = append(all, Unit{1, i})
		}
	}
	got, err := m.Pods().PreferPod(all, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := unitsOf(1, 8, 9); !slices.Equal(got, want) {
		t.Fatalf("preferred %v, want %v", got, want)
	}
	if m.View().Version != before {
		t.Fatal("a preference changed the table")
	}
	for _, c := range []struct {
		name      string
		available []Unit
		must      []Unit
		want      []Unit
	}{
		{"only what is offered", unitsOf(0, 2, 14, 15), nil, unitsOf(0, 14, 15)},
		{"must include", unitsOf(0, 0, 1, 2, 3), unitsOf(0, 3), unitsOf(0, 3, 0)},
		// A pod lease's units that the kubelet offers are free to it.
		{"offered pod units", unitsOf(1, 12, 15), nil, unitsOf(1, 12, 15)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := m.Pods().PreferPod(c.available, c.must, 2)
			slices.SortFunc(c.want, func(a, b Unit) int { return a.Index - b.Index })
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("preferred %v (%v), want %v", got, err, c.want)
			}
		})
	}
	for _, c := range []struct {
		name            string
		available, must []Unit
		size            int
		want            error
	}{
		{"more than M", all, nil, 3, api.ErrBadRequest},
		{"no two on one instance", unitsOf(0, 7, 8), nil, 2, api.ErrInsufficientUnits},
		{"must span instances", all, unitsOf(0, 7, 8), 2, api.ErrBadRequest},
		{"unknown unit", unitsOf(0, 99), nil, 1, api.ErrBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := m.Pods().PreferPod(c.available, c.must, c.size); !errors.Is(err, c.want) {
				t.Fatalf("preferred %v, err %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestPodLeaseSurvivesARestartAndEndsByEndPod(t *testing.T) {
	f := newFixture(t, 2, 4, 1)
	m1 := f.manager(t)
	g, _, err := m1.Pods().GrantPod(unitsOf(0, 1, 2), podOf("d1", "d2"))
	if err != nil {
		t.Fatal(err)
	}
	m1.Pods().SetPod(g.ID, api.LeasePod{Namespace: "ns", Name: "p", Container: "c"})
	if got, _ := m1.Get(root, g.ID); got.Pod.Name != "p" || !slices.Equal(got.Pod.Devices, []string{"d1", "d2"}) {
		t.Fatalf("after SetPod: %+v", got.Pod)
	}
	if g.Pod.Name != "" {
		t.Fatal("SetPod changed a lease already handed out")
	}
	m1.Close()

	m2 := f.manager(t)
	got, err := m2.Get(root, g.ID)
	if err != nil || got.Binding != "pod" || !slices.Equal(got.Units, []int{1, 2}) || !slices.Equal(got.Pod.Devices, []string{"d1", "d2"}) {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	ttl, err := m2.Acquire(context.Background(), root, ttlReq(1, "1m"))
	if err != nil {
		t.Fatal(err)
	}
	if m2.Pods().EndPod(ttl.ID, "x") {
		t.Fatal("EndPod ended a lease that is not a pod's")
	}
	if _, err := m2.Renew(root, g.ID); !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "pod") {
		t.Fatalf("renewing a pod lease: %v", err)
	}
	if !m2.Pods().EndPod(g.ID, "its pod is gone") {
		t.Fatal("EndPod did not end the pod lease")
	}
	if f.ledger.Present(0, 1) || f.ledger.Present(0, 2) {
		t.Fatal("an ended pod lease left its pipe files")
	}
	m2.Close()
	m3 := f.manager(t)
	if ls := m3.View().Leases(); len(ls) != 1 || ls[0].ID != ttl.ID {
		t.Fatalf("after the second restart %v; the ended pod lease must stay ended", ls)
	}
}

// Units set aside for a workflow reservation are not the kubelet's to give.
func TestPodsNeverTakeReservedUnits(t *testing.T) {
	h := newResHarness(t, 2, 4, 1) // 8 units per GPU
	h.reserve(alice, spec("wf", []int{16}))
	if _, _, err := h.m.Pods().GrantPod(unitsOf(1, 3), podOf()); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "reservation wf") {
		t.Fatalf("GrantPod of a reserved unit: %v", err)
	}
	if _, err := h.m.Pods().AdoptPod(unitsOf(0, 0), podOf()); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("AdoptPod of a reserved unit: %v", err)
	}
	if got, err := h.m.Pods().PreferPod(unitsOf(0, 0, 1, 2), nil, 1); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("PreferPod among reserved units: %v, %v", got, err)
	}
	if ls := h.m.View().Leases(); len(ls) != 0 {
		t.Fatalf("leases %v", ls)
	}
}
