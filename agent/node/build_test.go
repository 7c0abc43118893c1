package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/snapshot"
)

// testInputs are testNode's inputs: GPU 0 with 5 units leased, 2 claimed
// offline and 3 reserved, its instance 1 down; GPU 1 with both instances
// down.
func testInputs() Inputs {
	uid := uint32(1000)
	view := &lease.View{
		GPUs: []lease.GPUView{
			{Used: 7, Offline: 2, Reserved: 3, OfflineByUID: map[uint32]int{1001: 2},
				Instances: []lease.InstanceView{{FreeUnits: []int{5, 6, 7}, Size: 8, Clients: 2, UID: &uid, SlurmJobs: []uint64{42}}, {FreeUnits: []int{11}, Size: 8}},
				Leases:    []*api.Lease{{ID: "l1"}}, LeasesHere: 1},
			{Instances: []lease.InstanceView{{Size: 8}, {Size: 8}}},
		},
		Granted: 3, Ended: 2,
	}
	return Inputs{
		Now:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600)),
		View:    view,
		Samples: []inventory.Sample{{UtilizationPct: 30, UtilizationSource: api.UtilSourceGPM, MemoryUsedMiB: 2048, SMByPID: map[int]int{300: 10, 301: 15}}, {}},
		MPS: mpsByGPU{
			"GPU-0": {
				{Instance: 0, State: api.InstanceRunning, ServerUID: ptr(uid), Servers: []mpsctl.Server{{PID: 300, UID: &uid, Clients: []int{1, 2}}, {PID: 301}}},
				{Instance: 1, State: api.InstanceDown, Err: errors.New("no answer")},
			},
			"GPU-1": {{Instance: 0, State: api.InstanceDown}, {Instance: 1, State: api.InstanceStarting}},
		},
		Upstreams: []api.UpstreamStatus{{URL: "http://collector/v1/snapshots", Pushes: 4}},
		Usage: &usage.Table{GPUs: []usage.GPU{{OutsideMiB: 512, OverShare: 1}, {}},
			Running: []usage.Running{{ID: "l1", GPU: 0, UID: uid, Usage: &api.Usage{MemoryUsedMiB: 100}}}},
	}
}

func TestBuild(t *testing.T) {
	b := NewBuilder(testNode())
	in := testInputs()
	p := b.Build(in)
	s := p.Snapshot
	if s.Seq != 1 || s.Node != "n1" || s.BootID != "boot" || s.Backend != api.BackendSimulated || s.MPS != "on" || s.Schema != api.SnapshotSchema {
		t.Errorf("snapshot head = seq %d, node %q, boot %q, backend %q, mps %q", s.Seq, s.Node, s.BootID, s.Backend, s.MPS)
	}
	if !s.Time.Equal(in.Now) || s.Time.Location() != time.UTC {
		t.Errorf("time = %v, want %v in UTC", s.Time, in.Now)
	}
	if s.State != api.NodeWorking || s.Reason != "" {
		t.Errorf("state = %q (%q), want working", s.State, s.Reason)
	}
	if s.UnitsTotal != 32 || s.UnitsFree != 16-7-3+16 || s.UnitsReserved != 3 {
		t.Errorf("units total %d, free %d, reserved %d", s.UnitsTotal, s.UnitsFree, s.UnitsReserved)
	}
	if len(s.Upstreams) != 1 || s.Upstreams[0].Pushes != 4 {
		t.Errorf("upstreams = %+v, want the ones given", s.Upstreams)
	}

	g0, g1 := s.GPUs[0], s.GPUs[1]
	// One instance down degrades a GPU, which takes leases on the other.
	if g0.State != api.GPUDegraded || !g0.Eligible {
		t.Errorf("GPU 0: %q, eligible %v; want degraded and eligible", g0.State, g0.Eligible)
	}
	// With none running it takes none.
	if g1.State != api.GPUDegraded || g1.Eligible {
		t.Errorf("GPU 1: %q, eligible %v; want degraded, not eligible", g1.State, g1.Eligible)
	}
	if g0.UnitsUsed != 7 || g0.UnitsOffline != 2 || g0.UnitsFree != 6 || g0.OfflineByUID["1001"] != 2 {
		t.Errorf("GPU 0 units: used %d, offline %d, free %d, offline by uid %v", g0.UnitsUsed, g0.UnitsOffline, g0.UnitsFree, g0.OfflineByUID)
	}
	if g0.MaxUtilizationPct != 90 || g0.MemoryUsedMiB != 2048 || g0.OutsideMemoryMiB != 512 || g0.LeasesOverShare != 1 || g0.Capability.ComputeCapability != "9.0" {
		t.Errorf("GPU 0 figures: %+v", g0)
	}
	i0, i1 := g0.Instances[0], g0.Instances[1]
	if !slices.Equal(i0.Units, []int{0, 1, 2, 3, 4, 5, 6, 7}) || !slices.Equal(i1.Units, []int{8, 9, 10, 11, 12, 13, 14, 15}) {
		t.Errorf("instance units = %v, %v", i0.Units, i1.Units)
	}
	if i0.State != api.InstanceRunning || i0.UnitsFree != 3 || i0.Clients != 2 || i0.ClientsMax != 4 || i0.SMPct == nil || *i0.SMPct != 25 ||
		len(i0.Servers) != 2 || i0.Servers[0].Clients != 2 || !slices.Equal(i0.SlurmJobs, []uint64{42}) {
		t.Errorf("instance 0 = %+v", i0)
	}
	if i1.State != api.InstanceDown || i1.Error != "no answer" || i1.SMPct != nil {
		t.Errorf("instance 1 = %+v", i1)
	}

	// The measured leases are in the full metrics, not in the redacted.
	if !bytes.Contains(p.Metrics(), []byte("gpulet_lease_memory_used_bytes")) {
		t.Error("the metrics show no measured lease")
	}
	if bytes.Contains(p.Redacted().Metrics(), []byte("gpulet_lease_memory_used_bytes")) {
		t.Error("the redacted metrics show a measured lease")
	}
	if ls := p.Leases(); len(ls) != 1 || ls[0].ID != "l1" {
		t.Errorf("leases = %+v", ls)
	}

	if next := b.Build(in).Snapshot.Seq; next != 2 {
		t.Errorf("the next snapshot's seq = %d, want 2", next)
	}
}

func TestBuildNodeState(t *testing.T) {
	for _, c := range []struct {
		name               string
		draining           bool
		unrecorded         string
		wantState, wantWhy string
	}{
		{"draining", true, "", api.NodeDraining, ""},
		{"unrecorded", false, "the run dir is full", api.NodeDegraded, "the run dir is full"},
		{"both", true, "the run dir is full", api.NodeDegraded, "draining; the run dir is full"},
	} {
		in := testInputs()
		in.Draining = c.draining
		in.View.Unrecorded = c.unrecorded
		s := NewBuilder(testNode()).Build(in).Snapshot
		if s.State != c.wantState || s.Reason != c.wantWhy {
			t.Errorf("%s: state %q (%q), want %q (%q)", c.name, s.State, s.Reason, c.wantState, c.wantWhy)
		}
	}
}

// A failed GPU is failed whatever its instances; without MPS its instances
// are off and take leases.
func TestBuildFailedAndNoMPS(t *testing.T) {
	n := testNode()
	n.MPS = false
	in := testInputs()
	in.MPS, in.Usage = mpsByGPU{}, nil
	in.Samples[0].Err = errors.New("GPU is lost")
	s := NewBuilder(n).Build(in).Snapshot
	g0, g1 := s.GPUs[0], s.GPUs[1]
	if g0.State != api.GPUFailed || g0.Eligible || g0.Error != "GPU is lost" {
		t.Errorf("GPU 0: %q, eligible %v, error %q; want failed", g0.State, g0.Eligible, g0.Error)
	}
	if g1.State != api.GPUWorking || !g1.Eligible || g1.Instances[0].State != api.InstanceOff || s.MPS != "off" {
		t.Errorf("GPU 1: %q, eligible %v, instance %q, mps %q; want working, off", g1.State, g1.Eligible, g1.Instances[0].State, s.MPS)
	}
}

// A GPU whose part of the lease view (by its Built), sample, MPS instances
// and accounting read as in the last build is kept, with its encoding; one
// where any of them changed is made again. Either way the snapshot encodes
// as its fields say.
func TestBuildKeepsUnchangedGPUs(t *testing.T) {
	b := NewBuilder(testNode())
	in := testInputs()
	in.View.GPUs[0].Built, in.View.GPUs[1].Built = 4, 7
	prev := b.Build(in)
	prev.JSON()
	// build builds from in, and says which GPUs the build before's are.
	build := func(what string, want0, want1 bool) *snapshot.Published {
		t.Helper()
		p := b.Build(in)
		for i, want := range []bool{want0, want1} {
			if kept := &p.Snapshot.GPUs[i].Instances[0] == &prev.Snapshot.GPUs[i].Instances[0]; kept != want {
				t.Errorf("%s: GPU %d kept %v, want %v", what, i, kept, want)
			}
		}
		want, err := json.Marshal(p.Snapshot)
		if err != nil || !bytes.Equal(p.JSON(), append(want, '\n')) {
			t.Errorf("%s: encoded\n%s\nwant\n%s", what, p.JSON(), want)
		}
		prev = p
		return p
	}
	build("nothing changed", true, true)

	// A lease on GPU 0: its part of the view is built again.
	next := *in.View
	next.GPUs = slices.Clone(in.View.GPUs)
	next.GPUs[0].Built, next.GPUs[0].Used = 5, 8
	in.View = &next
	if p := build("GPU 0's view built again", false, true); p.Snapshot.GPUs[0].UnitsUsed != 8 {
		t.Errorf("GPU 0 shows %d units used, want 8", p.Snapshot.GPUs[0].UnitsUsed)
	}

	in.Samples = slices.Clone(in.Samples)
	in.Samples[1].MemoryUsedMiB = 4096
	build("GPU 1's sample changed", true, false)

	mps := mpsByGPU{"GPU-0": slices.Clone(in.MPS.Status("GPU-0")), "GPU-1": in.MPS.Status("GPU-1")}
	mps["GPU-0"][1].State = api.InstanceRunning
	in.MPS = mps
	if p := build("GPU 0's instance up again", false, true); p.Snapshot.GPUs[0].State != api.GPUWorking {
		t.Errorf("GPU 0 is %q with its instances up", p.Snapshot.GPUs[0].State)
	}

	in.Usage = &usage.Table{GPUs: []usage.GPU{{}, {}}}
	build("a new accounting round", false, false)
	build("nothing changed again", true, true)
}

// A failed config reload is in the snapshot, and in the redacted one without
// what the config said (it may quote users).
func TestBuildConfigError(t *testing.T) {
	in := testInputs()
	why := `the reload of /etc/gpulet.yaml failed: line 3: no user "bob" on this machine`
	in.ConfigError = &why
	p := NewBuilder(testNode()).Build(in)
	if got := p.Snapshot.ConfigError; got != why {
		t.Errorf("config_error %q, want %q", got, why)
	}
	if got := p.Redacted().Snapshot.ConfigError; got != "the last reload of the config failed" {
		t.Errorf("redacted config_error %q", got)
	}
	if !bytes.Contains(p.JSON(), []byte(`"config_error":`)) {
		t.Errorf("the snapshot's JSON has no config_error: %s", p.JSON())
	}
	in.ConfigError = nil
	if got := NewBuilder(testNode()).Build(in).Snapshot.ConfigError; got != "" {
		t.Errorf("config_error %q without a failed reload", got)
	}
}
