package units

import (
	"slices"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	tests := []struct {
		name       string
		m, n, k, u int
		wantU      int
		wantErr    string
		wantM      int
	}{
		{"defaults: 16 units, a process may hold the whole GPU", 0, 16, 1, 0, 16, "", 16},
		{"M given: U is M×N×K", 1, 16, 1, 0, 16, "", 1},
		{"M given: U is M×N×K, also below 16", 1, 4, 2, 0, 8, "", 1},
		{"M given: U is M×N×K, also above 16", 2, 16, 2, 0, 64, "", 2},
		{"U given, M follows it", 0, 16, 2, 32, 32, "", 32},
		{"K above 16", 0, 16, 20, 0, 20, "", 20},
		{"explicit U below max", 2, 4, 2, 10, 10, "", 2},
		{"U above M×N×K", 1, 4, 2, 9, 0, "9 is more than M×N×K = 1×4×2 = 8", 0},
		{"negative M", -1, 16, 1, 0, 0, "--units-per-client must be at least 1", 0},
		{"negative N", 1, -1, 1, 0, 0, "--clients-per-instance must be at least 1", 0},
		{"zero K", 1, 16, 0, 0, 0, "--instances-per-gpu must be at least 1", 0},
		{"negative U", 1, 16, 1, -3, 0, "--units-per-gpu must be at least 1", 0},
		{"U below K", 1, 16, 4, 3, 0, "fewer than --instances-per-gpu", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.m, tc.n, tc.k, tc.u)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || m.UnitsPerGPU != tc.wantU || m.UnitsPerClient != tc.wantM {
				t.Fatalf("got %+v, %v", m, err)
			}
		})
	}
}

func TestInstanceUnitsAreContiguousAndEven(t *testing.T) {
	m, err := New(1, 4, 3, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
	for k, w := range want {
		if got := m.InstanceUnits(k); !slices.Equal(got, w) {
			t.Errorf("instance %d: %v, want %v", k, got, w)
		}
		for _, u := range w {
			if m.InstanceOf(u) != k {
				t.Errorf("InstanceOf(%d) = %d, want %d", u, m.InstanceOf(u), k)
			}
		}
	}
	if m.InstanceOf(10) != -1 {
		t.Error("unit past U belongs to an instance")
	}
}

func TestThreadPercentageIsCeiling(t *testing.T) {
	m := Default()
	for n, want := range map[int]int{1: 7, 2: 13, 8: 50, 16: 100} {
		if got := m.ThreadPercentage(n); got != want {
			t.Errorf("ThreadPercentage(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestInstanceOfMatchesRanges(t *testing.T) {
	for _, shape := range [][4]int{{1, 16, 1, 0}, {1, 4, 3, 10}, {2, 5, 3, 29}, {1, 5000, 1, 0}, {3, 7, 5, 35}, {1, 8, 4, 5}} {
		m, err := New(shape[0], shape[1], shape[2], shape[3])
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for k := 0; k < m.InstancesPerGPU; k++ {
			for _, u := range m.InstanceUnits(k) {
				if m.InstanceOf(u) != k {
					t.Fatalf("%+v: InstanceOf(%d) = %d, want %d", m, u, m.InstanceOf(u), k)
				}
				seen++
			}
		}
		if seen != m.UnitsPerGPU || m.InstanceOf(-1) != -1 || m.InstanceOf(m.UnitsPerGPU) != -1 {
			t.Fatalf("%+v: ranges cover %d units", m, seen)
		}
	}
}
