package inventory

import (
	"regexp"
	"strings"
	"testing"

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
	if got := s.Sample(0, Load{UnitsUsed: 8, UnitsTotal: 16}); got != busy {
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
	bad, neg, big, st := 101, -1, uint64(1<<40), "melted"
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
	} {
		if err := s.Set(tc.index, tc.u); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := s.Sample(0, Load{UnitsTotal: 16}); got.UtilizationPct != 0 || got.Err != nil {
		t.Fatalf("a refused update changed state: %+v", got)
	}
}
