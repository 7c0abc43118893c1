package usage

import (
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/api"
)

// H100 figures: MPS servers of 66 MiB, clients of 86 MiB.
func TestAttribution(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	// 300 is a shell of lease b's process 200; 301 is its child, the CUDA job.
	parents := map[int]int{301: 300, 300: 200, 200: 1, 100: 1, 400: 1, 500: 1, 900: 1}
	in := Input{
		Now:            now,
		MemoryTotalMiB: []uint64{81559, 81559},
		Processes: [][]inventory.Process{
			{{PID: 900, MemoryUsedMiB: 66}, {PID: 100, MemoryUsedMiB: 86}, {PID: 301, MemoryUsedMiB: 6000}, {PID: 400, MemoryUsedMiB: 1000}, {PID: 500, MemoryUsedMiB: 120}},
			nil,
		},
		Leases: []Lease{
			{ID: "a", GPU: 0, PID: 100, ShareMiB: 5097},
			{ID: "b", GPU: 0, PID: 200, ShareMiB: 5097},
			{ID: "ttl", GPU: 0, ShareMiB: 5097},
			{ID: "c", GPU: 1, PID: 100, ShareMiB: 5097},
		},
		Claims:  []Claim{{GPU: 0, Instance: 0, Units: []int{5, 6}, UID: 1001, PID: 500, ShareMiB: 10194}},
		Servers: []Server{{GPU: 0, Instance: 0, PID: 900}},
		Parent:  func(pid int) int { return parents[pid] },
	}
	a := New()
	tab := a.Update(in)
	want := map[string]api.Usage{
		"a":   {MemoryUsedMiB: 86, MemoryPeakMiB: 86, PIDs: []int{100}, SampledAt: now},
		"b":   {MemoryUsedMiB: 6000, MemoryPeakMiB: 6000, PIDs: []int{301}, OverShare: true, SampledAt: now},
		"ttl": {PIDs: []int{}, SampledAt: now},
		"c":   {PIDs: []int{}, SampledAt: now},
	}
	for id, w := range want {
		got := tab.Leases[id]
		if got == nil || got.MemoryUsedMiB != w.MemoryUsedMiB || got.MemoryPeakMiB != w.MemoryPeakMiB || got.OverShare != w.OverShare ||
			!slices.Equal(got.PIDs, w.PIDs) || !got.SampledAt.Equal(now) {
			t.Errorf("lease %s: %+v, want %+v", id, got, w)
		}
	}
	g := tab.GPUs[0]
	if g.OutsideMiB != 1000 || len(g.Outside) != 1 || g.Outside[0].PID != 400 {
		t.Errorf("outside %d MiB %+v, want process 400's 1000 MiB (the MPS server is gpulet's)", g.OutsideMiB, g.Outside)
	}
	if g.OverShare != 1 || g.OutsideOverShare {
		t.Errorf("over share %d, outside over share %v; want 1 lease, and room left for the outside process", g.OverShare, g.OutsideOverShare)
	}
	if len(g.Claims) != 1 || g.Claims[0].Usage.MemoryUsedMiB != 120 || g.Claims[0].PID != 500 {
		t.Errorf("claims %+v, want the claim's process with 120 MiB", g.Claims)
	}

	// The peak stays when use falls; an ended lease is forgotten.
	in.Processes[0][2].MemoryUsedMiB = 10
	in.Leases = in.Leases[:2]
	tab = a.Update(in)
	if u := tab.Leases["b"]; u.MemoryUsedMiB != 10 || u.MemoryPeakMiB != 6000 || u.OverShare {
		t.Errorf("lease b after its use fell: %+v", u)
	}
	if _, ok := a.Peak("ttl"); ok {
		t.Error("an ended lease's peak is still kept")
	}
	if p, ok := a.Peak("b"); !ok || p != 6000 {
		t.Errorf("Peak(b) = %d, %v", p, ok)
	}
}

// TestOutsideEatsShares: a process beside gpulet that uses more than the
// leases leave free is flagged.
func TestOutsideEatsShares(t *testing.T) {
	in := Input{
		MemoryTotalMiB: []uint64{16000},
		Processes:      [][]inventory.Process{{{PID: 7, MemoryUsedMiB: 5000}}},
		Leases:         []Lease{{ID: "a", GPU: 0, PID: 100, ShareMiB: 12000}},
	}
	if g := New().Update(in).GPUs[0]; !g.OutsideOverShare || g.OutsideMiB != 5000 {
		t.Fatalf("gpu %+v: 5000 MiB outside where 4000 are free must be flagged", g)
	}
}

// TestSlurmJobProcesses: a process of a Slurm job is its lease's, whatever
// its parents.
func TestSlurmJobProcesses(t *testing.T) {
	in := Input{
		MemoryTotalMiB: []uint64{16000},
		Processes:      [][]inventory.Process{{{PID: 7, MemoryUsedMiB: 500}, {PID: 8, MemoryUsedMiB: 300}}},
		Leases:         []Lease{{ID: "job", GPU: 0, SlurmJob: 42, ShareMiB: 4000}},
		JobOf: func(pid int) uint64 {
			if pid == 7 {
				return 42
			}
			return 0
		},
	}
	tab := New().Update(in)
	if u := tab.Leases["job"]; u.MemoryUsedMiB != 500 || !slices.Equal(u.PIDs, []int{7}) {
		t.Fatalf("job lease usage %+v, want process 7's 500 MiB", u)
	}
	if g := tab.GPUs[0]; g.OutsideMiB != 300 {
		t.Fatalf("outside %d MiB, want process 8's 300", g.OutsideMiB)
	}
}

// TestIdleLeasesShareOneUsage: leases that run nothing on their GPU and never
// did share one usage (the same value each would have), and keep no peak;
// a lease that ran something keeps its own, with its peak, once its
// processes are gone too.
func TestIdleLeasesShareOneUsage(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	in := Input{
		Now:            now,
		MemoryTotalMiB: []uint64{81559},
		Processes:      [][]inventory.Process{{{PID: 100, MemoryUsedMiB: 86}}},
		Leases:         []Lease{{ID: "busy", PID: 100, ShareMiB: 5097}, {ID: "idle1", ShareMiB: 5097}, {ID: "idle2", ShareMiB: 5097}},
		Parent:         func(int) int { return 1 },
	}
	a := New()
	tab := a.Update(in)
	idle1, idle2, busy := tab.Leases["idle1"], tab.Leases["idle2"], tab.Leases["busy"]
	if idle1 != idle2 || busy == idle1 {
		t.Fatalf("idle leases' usages %p and %p, the busy lease's %p: want the idle ones shared, the busy one its own", idle1, idle2, busy)
	}
	if idle1.MemoryUsedMiB != 0 || idle1.MemoryPeakMiB != 0 || idle1.OverShare || idle1.PIDs == nil || len(idle1.PIDs) != 0 || !idle1.SampledAt.Equal(now) {
		t.Fatalf("idle usage %+v", idle1)
	}
	if _, kept := a.peaks["idle1"]; kept || len(a.peaks) != 1 {
		t.Fatalf("peaks kept: %v, want only the busy lease's", a.peaks)
	}
	in.Processes = [][]inventory.Process{{}}
	tab = a.Update(in)
	if u := tab.Leases["busy"]; u == tab.Leases["idle1"] || u.MemoryPeakMiB != 86 || u.MemoryUsedMiB != 0 {
		t.Fatalf("the busy lease once its process is gone: %+v, want its own usage with its peak of 86 MiB", u)
	}
}

// TestWholeGPULeaseSumsItsGPUs: a lease of two whole GPUs is listed once for
// each; its usage is what its process uses on both, its share both GPUs'
// memory, its peak the sum, and it runs once.
func TestWholeGPULeaseSumsItsGPUs(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	in := Input{
		Now:            now,
		MemoryTotalMiB: []uint64{81559, 81559},
		Processes: [][]inventory.Process{
			{{PID: 100, MemoryUsedMiB: 50000}},
			{{PID: 100, MemoryUsedMiB: 40000}, {PID: 101, MemoryUsedMiB: 1000}},
		},
		Leases: []Lease{
			{ID: "w", GPU: 0, PID: 100, ShareMiB: 81559, Whole: true},
			{ID: "w", GPU: 1, PID: 100, ShareMiB: 81559, Whole: true},
		},
		Parent: func(pid int) int { return map[int]int{101: 100}[pid] },
	}
	tab := New().Update(in)
	got := tab.Leases["w"]
	if got == nil || got.MemoryUsedMiB != 91000 || got.MemoryPeakMiB != 91000 || got.OverShare || !slices.Equal(got.PIDs, []int{100, 101}) {
		t.Fatalf("whole-GPU lease: %+v, want 91000 MiB (its peak too), not over its two GPUs' share, pids [100 101]", got)
	}
	if len(tab.Running) != 1 {
		t.Errorf("running %+v, want the lease once", tab.Running)
	}
	for g := range tab.GPUs {
		if tab.GPUs[g].OutsideMiB != 0 || tab.GPUs[g].OverShare != 0 {
			t.Errorf("GPU %d: %+v, want nothing outside and nothing over share", g, tab.GPUs[g])
		}
	}
}

// TestClaimChargedToItsHolders: a claimer that exited leaving its FIFO's
// descriptor to a re-parented child. The child (and what it starts) is the
// claim's, not the dead pid's, nor a process that reused that pid; a process
// of nobody's shows its uid.
func TestClaimChargedToItsHolders(t *testing.T) {
	// 700 took the lock and exited; its pid now runs 700's namesake of
	// another user, which is no holder. 800 holds the descriptor, 801 is
	// its CUDA child.
	parents := map[int]int{700: 1, 800: 1, 801: 800, 900: 1}
	uids := map[int]uint32{700: 1002, 900: 1003}
	in := Input{
		MemoryTotalMiB: []uint64{81559},
		Processes:      [][]inventory.Process{{{PID: 700, MemoryUsedMiB: 50}, {PID: 801, MemoryUsedMiB: 12000}, {PID: 900, MemoryUsedMiB: 70}}},
		Claims:         []Claim{{GPU: 0, Units: []int{0}, UID: 1001, PID: 800, Holders: []int{800}, ShareMiB: 5097}},
		Parent:         func(pid int) int { return parents[pid] },
		UIDOf: func(pid int) (uint32, bool) {
			uid, ok := uids[pid]
			return uid, ok
		},
	}
	g := New().Update(in).GPUs[0]
	if len(g.Claims) != 1 || g.Claims[0].Usage.MemoryUsedMiB != 12000 || !slices.Equal(g.Claims[0].Usage.PIDs, []int{801}) {
		t.Fatalf("claims %+v, want the holder's child's 12000 MiB", g.Claims)
	}
	if len(g.Outside) != 2 || g.Outside[0].PID != 700 || g.Outside[0].UID == nil || *g.Outside[0].UID != 1002 ||
		g.Outside[1].PID != 900 || g.Outside[1].UID == nil || *g.Outside[1].UID != 1003 {
		t.Fatalf("outside %+v, want 700 of uid 1002 and 900 of uid 1003", g.Outside)
	}
}
