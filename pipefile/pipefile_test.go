package pipefile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseUnitName(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		total int
		want  int
		ok    bool
	}{
		{"first", "unit-0", 16, 0, true},
		{"last", "unit-15", 16, 15, true},
		{"past the last", "unit-16", 16, 0, false},
		{"leading zero", "unit-01", 16, 0, false},
		{"no digits", "unit-", 16, 0, false},
		{"negative", "unit--1", 16, 0, false},
		{"plus sign", "unit-+1", 16, 0, false},
		{"trailing space", "unit-1 ", 16, 0, false},
		{"leading space", "unit- 1", 16, 0, false},
		{"other case", "Unit-1", 16, 0, false},
		{"letters after", "unit-1a", 16, 0, false},
		{"temporary name", ".claim-1", 16, 0, false},
		{"too many digits", "unit-99999999999", 16, 0, false},
		{"largest", "unit-999999999", MaxUnits + 1, 999999999, true},
		{"no total", "unit-0", 0, 0, false},
		{"unicode digit", "unit-١", 16, 0, false},
		{"empty", "", 16, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseUnitName(tc.in, tc.total)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("ParseUnitName(%q, %d) = %d, %v; want %d, %v", tc.in, tc.total, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzParseUnitName(f *testing.F) {
	for _, s := range []string{"unit-0", "unit-15", "unit-01", "unit-", "unit--1", "unit-999999999", "x", "unit-1\x00"} {
		f.Add(s, 16)
	}
	f.Add("unit-123456", MaxUnits)
	f.Fuzz(func(t *testing.T, name string, total int) {
		i, ok := ParseUnitName(name, total)
		if !ok {
			return
		}
		if i < 0 || i >= total || UnitName(i) != name {
			t.Fatalf("%q parsed as %d of %d, which is named %q", name, i, total, UnitName(i))
		}
	})
}

func TestRunDir(t *testing.T) {
	for _, tc := range []struct {
		name, flag, env, want string
	}{
		{"default", "", "", DefaultRunDir},
		{"environment", "", "/env", "/env"},
		{"flag over environment", "/flag", "/env", "/flag"},
		{"flag alone", "/flag", "", "/flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvRunDir, tc.env)
			if got := RunDir(tc.flag); got != tc.want {
				t.Fatalf("RunDir(%q) with %s=%q = %q, want %q", tc.flag, EnvRunDir, tc.env, got, tc.want)
			}
		})
	}
	if got := InstanceDir("/r", "GPU-a", 3); got != "/r/units/GPU-a/3" {
		t.Fatalf("InstanceDir = %q", got)
	}
}

func TestThreadPercentage(t *testing.T) {
	for _, tc := range []struct {
		n, total, want int
	}{
		{1, 16, 7}, {2, 16, 13}, {8, 16, 50}, {16, 16, 100},
		{1, 1, 100}, {1, 3, 34}, {2, 3, 67}, {1, 100, 1}, {1, 101, 1}, {1, 1000, 1}, {999, 1000, 100},
	} {
		if got := ThreadPercentage(tc.n, tc.total); got != tc.want {
			t.Errorf("ThreadPercentage(%d, %d) = %d, want %d", tc.n, tc.total, got, tc.want)
		}
	}
}

func TestMemoryShareMiB(t *testing.T) {
	for _, tc := range []struct {
		n, total  int
		mem, want uint64
	}{
		{1, 16, 81920, 5120}, {3, 16, 81920, 15360}, {16, 16, 81920, 81920},
		{1, 3, 10, 3}, {2, 3, 10, 6}, {1, 16, 15, 0},
	} {
		if got := MemoryShareMiB(tc.n, tc.total, tc.mem); got != tc.want {
			t.Errorf("MemoryShareMiB(%d, %d, %d) = %d, want %d", tc.n, tc.total, tc.mem, got, tc.want)
		}
	}
}

func TestScaleMemLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string // "" for an error
	}{
		{"one unit", "0=5120M", 1, "0=5120M"},
		{"three units", "0=5120M", 3, "0=15360M"},
		{"several devices keep their units", "0=1G,1=512MB", 2, "0=2G,1=1024MB"},
		{"no unit", "0=4096", 2, "0=8192"},
		{"empty", "", 1, ""},
		{"no size", "0=M", 1, ""},
		{"device not a number", "x=1M", 1, ""},
		{"digits after the unit", "0=1M2", 1, ""},
		{"negative", "0=-1M", 1, ""},
		{"zero units", "0=1M", 0, ""},
		{"overflow", "0=18446744073709551615M", 2, ""},
		{"no equals", "5120M", 1, ""},
		{"empty entry", "0=1M,", 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ScaleMemLimit(tc.in, tc.n)
			if got != tc.want || (tc.want == "") != (err != nil) {
				t.Fatalf("ScaleMemLimit(%q, %d) = %q, %v; want %q", tc.in, tc.n, got, err, tc.want)
			}
		})
	}
}

func FuzzScaleMemLimit(f *testing.F) {
	for _, s := range []string{"0=5120M", "0=1G,1=512MB", "0=", "=1M", "0=99999999999999999999M", "0=0M"} {
		f.Add(s, 2)
	}
	f.Add("0=5120M", 0)
	f.Add("0=5120M", -3)
	f.Fuzz(func(t *testing.T, v string, n int) {
		got, err := ScaleMemLimit(v, n)
		if err != nil {
			return
		}
		if n < 1 || strings.Count(got, ",") != strings.Count(v, ",") || strings.Count(got, "=") != strings.Count(v, "=") {
			t.Fatalf("ScaleMemLimit(%q, %d) = %q", v, n, got)
		}
		// What it gives back scales again: it is a valid value.
		if _, err := ScaleMemLimit(got, 1); err != nil {
			t.Fatalf("ScaleMemLimit(%q, %d) = %q, which does not parse: %v", v, n, got, err)
		}
	})
}

func TestScaleEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		n, total int
		want     map[string]string // nil for an error
	}{
		{
			name: "visible devices from the uuid", env: map[string]string{EnvPipeDirectory: "/p"}, n: 5, total: 16,
			want: map[string]string{EnvPipeDirectory: "/p", EnvVisibleDevices: "GPU-z", EnvThreadPercentage: "32"},
		},
		{
			name: "memory limit scaled", env: map[string]string{EnvVisibleDevices: "GPU-y", EnvThreadPercentage: "7", EnvPinnedMemLimit: "0=5120M"}, n: 2, total: 16,
			want: map[string]string{EnvVisibleDevices: "GPU-y", EnvThreadPercentage: "13", EnvPinnedMemLimit: "0=10240M"},
		},
		{name: "bad memory limit", env: map[string]string{EnvPinnedMemLimit: "lots"}, n: 1, total: 16},
		{name: "no units", env: map[string]string{}, n: 0, total: 16},
		{name: "no total", env: map[string]string{}, n: 1, total: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ScaleEnv(tc.env, "GPU-z", tc.n, tc.total)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("ScaleEnv = %v, want an error", got)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("ScaleEnv = %v, %v; want %v", got, err, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("ScaleEnv = %v; want %v", got, tc.want)
				}
			}
		})
	}
}

func TestDecodeLayout(t *testing.T) {
	const head = `{"schema":"gpulet.layout/v1","gpus":[`
	for _, tc := range []struct {
		name, json, err string
	}{
		{"good", head + `{"index":0,"uuid":"GPU-a","units_total":2,"instances":[{"instance":0,"units":[0,1]}]}]}`, ""},
		{"no gpus", head + `]}`, ""},
		{"not json", `{`, "malformed layout"},
		{"other schema", `{"schema":"other/v9"}`, `layout schema "other/v9"`},
		{"path in uuid", head + `{"uuid":"../etc","units_total":1}]}`, "bad UUID"},
		{"dot uuid", head + `{"uuid":"..","units_total":1}]}`, "bad UUID"},
		{"empty uuid", head + `{"uuid":"","units_total":1}]}`, "bad UUID"},
		{"nul in uuid", head + `{"uuid":"a\u0000b","units_total":1}]}`, "bad UUID"},
		{"no units", head + `{"uuid":"GPU-a","units_total":0}]}`, "has 0 units"},
		{"too many units", head + `{"uuid":"GPU-a","units_total":1000000000}]}`, "has 1000000000 units"},
		{"unit out of range", head + `{"uuid":"GPU-a","units_total":2,"instances":[{"units":[2]}]}]}`, "outside 0..1"},
		{"negative unit", head + `{"uuid":"GPU-a","units_total":2,"instances":[{"units":[-1]}]}]}`, "outside 0..1"},
		{"negative instance", head + `{"uuid":"GPU-a","units_total":2,"instances":[{"instance":-1}]}]}`, "instance -1"},
		{"unit twice", head + `{"uuid":"GPU-a","units_total":2,"instances":[{"instance":0,"units":[0]},{"instance":1,"units":[0]}]}]}`, "unit 0 in two instances"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeLayout([]byte(tc.json))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}

func FuzzDecodeLayout(f *testing.F) {
	good, _ := json.Marshal(Layout{Schema: LayoutSchema, GPUs: []LayoutGPU{{UUID: "GPU-a", UnitsTotal: 2, Instances: []LayoutInstance{{Units: []int{0, 1}, Env: map[string]string{EnvPinnedMemLimit: "0=1M"}}}}}})
	for _, s := range []string{string(good), `{}`, `{"schema":"gpulet.layout/v1","gpus":[{"uuid":"../x","units_total":1}]}`, `x`,
		`{"schema":"gpulet.layout/v1","gpus":[{"uuid":"a","units_total":3,"instances":[{"units":[0,0]}]}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		lay, err := DecodeLayout([]byte(b))
		if err != nil {
			return
		}
		for _, g := range lay.GPUs {
			if g.UUID == "" || filepath.Base(g.UUID) != g.UUID || g.UUID == ".." || g.UUID == "." || strings.ContainsRune(g.UUID, 0) {
				t.Fatalf("accepted UUID %q", g.UUID)
			}
			if g.UnitsTotal < 1 || g.UnitsTotal > MaxUnits {
				t.Fatalf("accepted %d units", g.UnitsTotal)
			}
			seen := map[int]bool{}
			for _, in := range g.Instances {
				for _, u := range in.Units {
					if u < 0 || u >= g.UnitsTotal || seen[u] {
						t.Fatalf("accepted unit %d of %d (seen %v)", u, g.UnitsTotal, seen[u])
					}
					seen[u] = true
					// Every unit a layout gives has a name that parses back.
					if i, ok := ParseUnitName(UnitName(u), g.UnitsTotal); !ok || i != u {
						t.Fatalf("unit %d of %d has no name", u, g.UnitsTotal)
					}
				}
				// Scaling an accepted layout's environment never panics.
				ScaleEnv(in.Env, g.UUID, 1, g.UnitsTotal)
			}
		}
	})
}

func TestReadLayout(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadLayout(dir); err == nil || !strings.Contains(err.Error(), "no pipe-file ledger at "+filepath.Join(dir, "units", "layout.json")) {
		t.Fatalf("no layout: %v", err)
	}
	if err := os.MkdirAll(UnitsRoot(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(UnitsRoot(dir), LayoutFile)
	for _, tc := range []struct {
		name string
		body []byte
		err  string
	}{
		{"other schema", []byte(`{"schema":"other/v9"}`), `layout schema "other/v9"`},
		{"too large", make([]byte, MaxLayout+1), "larger than"},
		{"good", []byte(`{"schema":"gpulet.layout/v1","gpus":[{"uuid":"GPU-a","units_total":1}]}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, tc.body, 0o644); err != nil {
				t.Fatal(err)
			}
			lay, err := ReadLayout(dir)
			if tc.err == "" {
				if err != nil || len(lay.GPUs) != 1 {
					t.Fatalf("ReadLayout = %+v, %v", lay, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err %v, want %q naming %s", err, tc.err, path)
			}
		})
	}
}
