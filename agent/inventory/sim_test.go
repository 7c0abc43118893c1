package inventory

import (
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

func TestParseSimSpec(t *testing.T) {
	tests := []struct {
		name    string
		spec    string
		want    []string // NVML names
		wantErr string
	}{
		{"default", "2xA100-80GB", []string{"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"}, ""},
		{"mixed", "2xA100-80GB,1xT4-16GB", []string{"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "Tesla T4"}, ""},
		{"count left out", "H100-80GB", []string{"NVIDIA H100 80GB HBM3"}, ""},
		{"short unique name", "1xT4,l4", []string{"Tesla T4", "NVIDIA L4"}, ""},
		{"case and spaces", " 1xa10-24gb , 1xV100-32GB", []string{"NVIDIA A10", "Tesla V100-SXM2-32GB"}, ""},
		{"ambiguous short name", "A100", nil, `model "A100" is ambiguous: say which of A100-40GB, A100-80GB`},
		{"unknown model", "2xB200", nil, `unknown model "B200"`},
		{"zero count", "0xT4", nil, "count must be"},
		{"empty", "", nil, "empty"},
		{"empty item", "T4,,T4", nil, `unknown model ""`},
		{"too many", "65xT4", nil, "more than 64"},
		{"huge count", "99999999999999999999xT4", nil, "count must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSimSpec(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "A100-80GB") || !strings.Contains(err.Error(), "COUNTxMODEL") {
					t.Fatalf("error does not list the accepted forms and models: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, m := range got {
				names = append(names, m.Name)
			}
			if strings.Join(names, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %v, want %v", names, tc.want)
			}
		})
	}
}

func TestModelsCoverTheRequiredCards(t *testing.T) {
	for _, key := range []string{"T4-16GB", "V100-32GB", "A10-24GB", "L4-24GB", "A100-40GB", "A100-80GB", "H100-80GB"} {
		m, ok := findModel(key)
		if !ok || m.MemoryTotalMiB == 0 || m.MaxSMClockMHz == 0 || m.MemoryBusWidthBit == 0 || m.CCMajor == 0 {
			t.Errorf("model %s missing or incomplete: %+v", key, m)
		}
	}
}

func FuzzParseSimSpec(f *testing.F) {
	for _, s := range []string{"2xA100-80GB", "2xA100-80GB,1xT4-16GB", "T4", "0xT4", "x", "1x", "xT4", ",", "64xT4", "1xH100-80GB,1xL4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		models, err := ParseSimSpec(spec)
		if err != nil {
			if len(models) != 0 {
				t.Fatal("models returned with an error")
			}
			return
		}
		if len(models) == 0 || len(models) > maxSimGPUs {
			t.Fatalf("%q: %d models", spec, len(models))
		}
	})
}

var uuidRE = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestSimUUIDsAreStableAndDistinct(t *testing.T) {
	a, b := NewSim("n1", []Model{Models[0], Models[0]}), NewSim("n1", []Model{Models[0], Models[0]})
	other := NewSim("n2", []Model{Models[0]})
	da, db := a.Devices(), b.Devices()
	if da[0].UUID != db[0].UUID || da[1].UUID != db[1].UUID {
		t.Fatal("UUIDs differ between two runs on the same node")
	}
	if da[0].UUID == da[1].UUID || da[0].UUID == other.Devices()[0].UUID {
		t.Fatal("UUIDs repeat across GPUs or nodes")
	}
	for _, d := range da {
		if !uuidRE.MatchString(d.UUID) {
			t.Fatalf("UUID %q is not of NVML's form", d.UUID)
		}
	}
}

func TestSimFollowsLoadUnlessOverridden(t *testing.T) {
	s := NewSim("n", []Model{Models[5]})
	idle := s.Sample(0, Load{UnitsUsed: 0, UnitsTotal: 16})
	busy := s.Sample(0, Load{UnitsUsed: 8, UnitsTotal: 16})
	if idle.UtilizationPct != 0 || idle.MemoryUsedMiB != 0 {
		t.Fatalf("idle sample %+v", idle)
	}
	if busy.UtilizationPct <= idle.UtilizationPct || busy.MemoryUsedMiB != 81920/2 {
		t.Fatalf("busy sample %+v does not follow the units", busy)
	}
	u, st := 95, api.GPUFailed
	if err := s.Set(0, api.SimGPUUpdate{UtilizationPct: &u}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, Load{UnitsUsed: 0, UnitsTotal: 16}); got.UtilizationPct != 95 || got.Err != nil {
		t.Fatalf("after override: %+v", got)
	}
	if err := s.Set(0, api.SimGPUUpdate{State: &st}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, Load{}); got.Err == nil || got.UtilizationPct != 95 {
		t.Fatalf("failed state not reported, or utilization lost: %+v", got)
	}
	// A reset undoes every setting: the GPU follows its units again.
	if err := s.Set(0, api.SimGPUUpdate{Reset: true}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, Load{UnitsUsed: 8, UnitsTotal: 16}); !reflect.DeepEqual(got, busy) {
		t.Fatalf("after a reset: %+v, want what the units make, %+v", got, busy)
	}
	// With a setting in the same update, the setting holds after the reset.
	if err := s.Set(0, api.SimGPUUpdate{Reset: true, UtilizationPct: &u}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, Load{}); got.UtilizationPct != 95 || got.Err != nil {
		t.Fatalf("reset with a setting: %+v", got)
	}
}

func TestSimSetRefusesBadInput(t *testing.T) {
	s := NewSim("n", []Model{Models[0]})
	bad, neg, big, small, st := 101, -1, uint64(1<<40), uint64(10), "melted"
	for name, tc := range map[string]struct {
		index int
		u     api.SimGPUUpdate
	}{
		"no such gpu":    {3, api.SimGPUUpdate{UtilizationPct: &neg}},
		"nothing":        {0, api.SimGPUUpdate{}},
		"over 100":       {0, api.SimGPUUpdate{UtilizationPct: &bad}},
		"negative":       {0, api.SimGPUUpdate{UtilizationPct: &neg}},
		"memory too big": {0, api.SimGPUUpdate{MemoryUsedMiB: &big}},
		"unknown state":  {0, api.SimGPUUpdate{State: &st}},
		"process no pid": {0, api.SimGPUUpdate{Process: &api.SimProcess{MemoryUsedMiB: &small}}},
		"process both":   {0, api.SimGPUUpdate{Process: &api.SimProcess{PID: 7, MemoryUsedMiB: &small, Gone: true}}},
		"process empty":  {0, api.SimGPUUpdate{Process: &api.SimProcess{PID: 7}}},
		"process huge":   {0, api.SimGPUUpdate{Process: &api.SimProcess{PID: 7, MemoryUsedMiB: &big}}},
		"process pid":    {0, api.SimGPUUpdate{Process: &api.SimProcess{PID: 1 << 22, MemoryUsedMiB: &small}}},
	} {
		if err := s.Set(tc.index, tc.u); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := s.Sample(0, Load{UnitsTotal: 16}); got.UtilizationPct != 0 || got.Err != nil {
		t.Fatalf("a refused update changed state: %+v", got)
	}
}

// TestSimReadsLikeAnH100: a client on a few SMs keeps a kernel running all
// the time, while the SM utilization is the SMs its thread percentage gives
// it. On the H100 of docs/hardware.md (the check at 2f1cbd2, and
// test/gpu/run.sh at 33a66a0), utilization.gpu read 100 for one client on 2
// of 16 units, while GPM read 12.1, 24.2 and 50.0% for busy clients on 2, 4
// and 8 units (CUDA gave them 16, 32 and 66 of 132 SMs), and 24.2 for two
// clients on 2. NVML listed each MPS server as a process with 66 MiB.
func TestSimReadsLikeAnH100(t *testing.T) {
	h100 := Models[6]
	if h100.Key != "H100-80GB" || smCount(NewSim("n", []Model{h100}).Devices()[0]) != 132 {
		t.Fatalf("model %s: want the H100, with 132 SMs", h100.Key)
	}
	s := NewSim("n", []Model{h100})
	idle := s.Sample(0, Load{UnitsTotal: 16, MPS: true})
	if idle.KernelTimePct != 0 || idle.UtilizationPct != 0 || idle.UtilizationSource != api.UtilSourceSimulated {
		t.Fatalf("idle: %+v", idle)
	}
	for _, tc := range []struct {
		units []int
		gpm   float64 // what the H100 read
	}{{[]int{2}, 12.1}, {[]int{4}, 24.2}, {[]int{8}, 50.0}, {[]int{2, 2}, 24.2}} {
		s := NewSim("n", []Model{h100})
		load := Load{UnitsTotal: 16, MPS: true}
		var base uint64
		for i, u := range tc.units {
			base += h100.MemoryTotalMiB * uint64(u) / 16
			load.UnitsUsed += u
			load.Clients = append(load.Clients, Client{PID: 100 + i, UID: 1000, Units: u, ShareMiB: h100.MemoryTotalMiB * uint64(u) / 16})
		}
		got := s.Sample(0, load)
		if got.KernelTimePct != 100 || math.Abs(float64(got.UtilizationPct)-tc.gpm) > 0.5 {
			t.Errorf("clients on %v of 16 units: kernel time %d (want 100), SM %d%% (the H100 read %.1f)", tc.units, got.KernelTimePct, got.UtilizationPct, tc.gpm)
		}
		servers := s.ServerList(s.Devices()[0].UUID, 0)
		if len(servers) != 1 || math.Abs(float64(got.SMByPID[servers[0]])-tc.gpm) > 0.5 {
			t.Errorf("clients on %v: servers %v, SM by pid %v: want one server with the instance's SM figure", tc.units, servers, got.SMByPID)
		}
		want := Process{PID: servers[0], MemoryUsedMiB: simServerMiB}
		if n := len(tc.units); len(got.Processes) != n+1 || got.Processes[n] != want {
			t.Errorf("clients on %v: processes %+v, want the clients and the server with %d MiB", tc.units, got.Processes, simServerMiB)
		}
		if got.MemoryUsedMiB != base+simServerMiB {
			t.Errorf("clients on %v: memory used %d MiB, want the units' share %d and the server's %d", tc.units, got.MemoryUsedMiB, base, simServerMiB)
		}
	}
}

// TestSimFullGPUReadsFull: a GPU whose every unit is busy reads 100% of its
// SMs, with or without MPS, so --max-utilization 90 closes it before its
// last units are leased, as it would a real one.
func TestSimFullGPUReadsFull(t *testing.T) {
	for _, mps := range []bool{false, true} {
		s := NewSim("n", []Model{Models[6]})
		load := Load{UnitsUsed: 16, UnitsTotal: 16, MPS: mps}
		for i := range 8 {
			load.Clients = append(load.Clients, Client{PID: 100 + i, UID: 1000, Units: 2})
		}
		if got := s.Sample(0, load); got.UtilizationPct != 97 && mps || got.UtilizationPct != 100 && !mps {
			t.Errorf("MPS %v, eight 2-unit clients: SM %d%%, want 100 (97 under MPS: 8 × 16 of 132 SMs)", mps, got.UtilizationPct)
		}
		if got := NewSim("n", []Model{Models[6]}).Sample(0, Load{UnitsUsed: 16, UnitsTotal: 16, MPS: mps}); got.UtilizationPct != 100 {
			t.Errorf("MPS %v, 16 units leased with no process known: SM %d%%, want 100", mps, got.UtilizationPct)
		}
	}
}

// TestSimProcessUtilizationEveryTenthSample: the per-process SM figures are
// read as gpuletd reads NVML's on a GPU with GPM, once every
// processUtilEvery samples, each read costing what the H100's call did
// (1,368 µs); in between, a sample keeps the figures last read.
func TestSimProcessUtilizationEveryTenthSample(t *testing.T) {
	s := NewSim("n", []Model{Models[6]})
	one := Load{UnitsUsed: 2, UnitsTotal: 16, Clients: []Client{{PID: 100, UID: 1000, Units: 2}}}
	two := Load{UnitsUsed: 4, UnitsTotal: 16, Clients: []Client{{PID: 100, UID: 1000, Units: 2}, {PID: 101, UID: 1000, Units: 2}}}
	for i := range 2 * processUtilEvery {
		load := one
		if i >= 3 {
			load = two
		}
		got, read := s.read(0, load)
		if read != (i%processUtilEvery == 0) {
			t.Fatalf("sample %d: per-process figures read %v", i, read)
		}
		want := map[int]int{100: 13}
		if i >= processUtilEvery {
			want = map[int]int{100: 13, 101: 13}
		}
		// Without MPS a job on 2 of 16 units uses its share, 12.5%.
		if !maps.Equal(got.SMByPID, want) || got.UtilizationPct != []int{13, 25}[len(load.Clients)-1] {
			t.Fatalf("sample %d: SM %d%%, by pid %v; want by pid %v", i, got.UtilizationPct, got.SMByPID, want)
		}
	}
	t0 := time.Now()
	s.Sample(0, one)
	if took := time.Since(t0); took < simProcessUtilCost {
		t.Fatalf("a sample that read the per-process figures took %s, want at least %s", took, simProcessUtilCost)
	}
}

// TestSimMPSServerStaysIdleUntilAnotherUID: the server of uid 1000 stays up
// with no client after its job; a client of uid 1001 gets a server of its own
// uid in its place; a client of 1001 arriving while 1000's server is busy
// waits and is not served.
func TestSimMPSServerStaysIdleUntilAnotherUID(t *testing.T) {
	s := NewSim("n", []Model{Models[6]})
	uuid := s.Devices()[0].UUID
	run := func(cs ...Client) Sample {
		return s.Sample(0, Load{UnitsUsed: len(cs), UnitsTotal: 16, MPS: true, Clients: cs})
	}
	run(Client{PID: 100, UID: 1000, Units: 1})
	first := s.ServerList(uuid, 0)
	run()
	idle := s.ServerList(uuid, 0)
	if len(first) != 1 || !slices.Equal(first, idle) {
		t.Fatalf("servers %v then %v: the server must stay up after its last client", first, idle)
	}
	if cs, ok := s.ClientList(idle[0]); !ok || len(cs) != 0 {
		t.Fatalf("idle server's clients %v, %v; want none", cs, ok)
	}
	if uid, _ := s.ServerUID(idle[0]); uid != 1000 {
		t.Fatalf("idle server uid %d, want 1000", uid)
	}
	run(Client{PID: 200, UID: 1001, Units: 1})
	next := s.ServerList(uuid, 0)
	if uid, _ := s.ServerUID(next[0]); len(next) != 1 || next[0] == idle[0] || uid != 1001 {
		t.Fatalf("servers %v (uid %d): another uid's client must get a server of its own", next, uid)
	}
	if _, ok := s.ServerUID(idle[0]); ok {
		t.Fatalf("the replaced server %d is still known", idle[0])
	}
	got := run(Client{PID: 200, UID: 1001, Units: 1}, Client{PID: 300, UID: 1002, Units: 1})
	if len(got.Processes) != 2 || got.Processes[0].PID != 200 || got.Processes[1].PID != next[0] {
		t.Fatalf("processes %+v: a client of another uid than the busy server's must wait, its server listed", got.Processes)
	}
}

// TestSimWholeGPUClientHasNoMPSServer: a whole-GPU lease's process runs
// without MPS (its environment names no pipe folder), so, as on the
// hardware, it gets no MPS server and its SM figure is its own.
func TestSimWholeGPUClientHasNoMPSServer(t *testing.T) {
	s := NewSim("n", []Model{Models[6]})
	uuid := s.Devices()[0].UUID
	got := s.Sample(0, Load{UnitsUsed: 16, UnitsTotal: 16, MPS: true, Clients: []Client{{PID: 100, UID: 1000, Units: 16, Whole: true}}})
	if servers := s.ServerList(uuid, 0); len(servers) != 0 {
		t.Fatalf("servers %v for a whole-GPU lease's process, want none", servers)
	}
	if len(got.Processes) != 1 || got.Processes[0].PID != 100 || got.SMByPID[100] == 0 {
		t.Fatalf("processes %+v, SM by pid %v: want the process, with an SM figure of its own", got.Processes, got.SMByPID)
	}
}

// TestSimProcessSettings: a process set through Set uses what it was given: a
// client's own memory, or memory beside gpulet's leases.
func TestSimProcessSettings(t *testing.T) {
	s := NewSim("n", []Model{Models[6]})
	share, big, outside := uint64(5000), uint64(9000), uint64(3000)
	for _, p := range []api.SimProcess{{PID: 100, MemoryUsedMiB: &big}, {PID: 77, MemoryUsedMiB: &outside}} {
		if err := s.Set(0, api.SimGPUUpdate{Process: &p}); err != nil {
			t.Fatal(err)
		}
	}
	// Without MPS: no server among the processes.
	load := Load{UnitsUsed: 1, UnitsTotal: 16, Clients: []Client{{PID: 100, UID: 1000, Units: 1, ShareMiB: share}}}
	got := s.Sample(0, load)
	want := []Process{{PID: 77, MemoryUsedMiB: outside}, {PID: 100, MemoryUsedMiB: big}}
	if !slices.Equal(got.Processes, want) {
		t.Fatalf("processes %+v, want %+v", got.Processes, want)
	}
	if got.MemoryUsedMiB != big+outside {
		t.Fatalf("memory used %d, want what the processes use, %d", got.MemoryUsedMiB, big+outside)
	}
	if err := s.Set(0, api.SimGPUUpdate{Process: &api.SimProcess{PID: 77, Gone: true}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, load); len(got.Processes) != 1 {
		t.Fatalf("processes %+v after the outside one is gone", got.Processes)
	}
}

// TestSimMemoryAddsUp: the GPU's memory in use is what its processes use
// and the share of the units no known process holds, so that no process
// (and no lease, whose usage is its processes') reads more than its GPU: a
// one-unit client with 60 GiB of an A100 80 GB's pinned limit uses 60 GiB,
// not its unit's 5 GiB.
func TestSimMemoryAddsUp(t *testing.T) {
	a100 := Models[5]
	for _, tc := range []struct {
		name string
		mps  bool
		load Load
		want uint64
	}{
		{"a client that asked 60 GiB", true, Load{UnitsUsed: 1, UnitsTotal: 16, MPS: true, Clients: []Client{{PID: 100, UID: 1000, Units: 1, ShareMiB: 61440}}},
			61440 + simServerMiB},
		{"two clients of one process", false, Load{UnitsUsed: 3, UnitsTotal: 16, Clients: []Client{{PID: 100, Units: 1, ShareMiB: 1000}, {PID: 100, Units: 2, ShareMiB: 2000}}},
			3000},
		{"units of no known process", false, Load{UnitsUsed: 4, UnitsTotal: 16, Clients: []Client{{PID: 100, Units: 1, ShareMiB: 30000}}},
			30000 + 3*81920/16},
		{"a whole-GPU lease", true, Load{UnitsUsed: 16, UnitsTotal: 16, MPS: true, Clients: []Client{{PID: 100, Units: 16, ShareMiB: 81920, Whole: true}}},
			81920},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NewSim("n", []Model{a100}).Sample(0, tc.load)
			if got.MemoryUsedMiB != tc.want {
				t.Errorf("memory used %d MiB, want %d", got.MemoryUsedMiB, tc.want)
			}
			for _, p := range got.Processes {
				if p.MemoryUsedMiB > got.MemoryUsedMiB {
					t.Errorf("process %d uses %d MiB, more than its GPU's %d", p.PID, p.MemoryUsedMiB, got.MemoryUsedMiB)
				}
			}
		})
	}
}
