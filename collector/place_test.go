package collector

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// withInstances gives every GPU of s one MPS instance owning all its units,
// with the GPU's free units free, as gpuletd's snapshots have them.
func withInstances(s *api.Snapshot) *api.Snapshot {
	for i := range s.GPUs {
		g := &s.GPUs[i]
		units := make([]int, g.UnitsTotal)
		for u := range units {
			units[u] = u
		}
		g.Instances = []api.Instance{{Instance: 0, State: api.InstanceOff, Units: units, UnitsFree: g.UnitsFree, ClientsMax: 16}}
		g.Capability = api.Capability{ComputeCapability: "8.0"}
	}
	return s
}

// TestPlacements: the collector answers where a request goes over the nodes'
// last snapshots, best-fit first, by the nodes' own engine; a node that
// changes or goes silent is judged by what it says now.
func TestPlacements(t *testing.T) {
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	s := NewServer(st, nil)
	// n1's GPUs have 6 and 5 free, n2's 3 and 2 (testSnapshot: free-i).
	st.Apply(withInstances(testSnapshot("n1", "b", 1, 6, 2)))
	st.Apply(withInstances(testSnapshot("n2", "b", 1, 3, 2)))
	place := func(body, query string) (int, PlacementList, []byte) {
		t.Helper()
		code, b := do(t, s, "POST", "/v1/placements"+query, []byte(body))
		var l PlacementList
		if code == 200 {
			if err := json.Unmarshal(b, &l); err != nil {
				t.Fatal(err)
			}
		}
		return code, l, b
	}
	code, l, b := place(`{"units":2}`, "?limit=3")
	got := []string{}
	for _, p := range l.Placements {
		got = append(got, fmt.Sprintf("%s/%d", p.Node, p.GPU.Index))
	}
	// Best-fit: the tightest GPU that fits, n2's GPU 1 (2 free), then the
	// fuller node's other GPU, then n1's.
	if code != 200 || l.Policy != "best-fit" || l.Nodes != 2 || strings.Join(got, " ") != "n2/1 n1/1" {
		t.Fatalf("placements of 2 units: %d %s (got %v)", code, b, got)
	}
	if code, _, b := place(`{"units":7}`, ""); code != 409 {
		t.Fatalf("7 units, which no GPU has free: %d %s", code, b)
	}
	// n1 fills up: the answer follows its new snapshot.
	st.Apply(withInstances(testSnapshot("n1", "b", 2, 0, 2)))
	if code, l, b := place(`{"units":3}`, ""); code != 200 || l.Placements[0].Node != "n2" || l.Placements[0].GPU.Index != 0 {
		t.Fatalf("3 units after n1 filled up: %d %s", code, b)
	}
	// A silent node is not_working: nothing goes there.
	clock.Add(16 * time.Second)
	st.Apply(withInstances(testSnapshot("n1", "b", 3, 6, 2)))
	if code, l, b := place(`{"units":3}`, ""); code != 200 || len(l.Placements) != 1 || l.Placements[0].Node != "n1" {
		t.Fatalf("3 units with n2 silent: %d %s", code, b)
	}
	for _, tc := range []struct{ body, query, want string }{
		{`{"units":1,"pool":"training"}`, "", "pools are each node's own config"},
		{`{"units":1,"gpus":1}`, "", "one of them"},
		{`{}`, "", "one of them"},
		{`{"units":1,"min_cc":"eight"}`, "", "min_cc"},
		{`{"units":1,"x":1}`, "", "unknown field"},
		{`{"units":1}`, "?limit=0", "limit"},
		{`{"units":1}`, "?node=n1", "only ?limit"},
	} {
		if code, _, b := place(tc.body, tc.query); code != 400 || !strings.Contains(errorMessage(t, b), tc.want) {
			t.Errorf("%s %s: %d %s, want 400 saying %q", tc.body, tc.query, code, b, tc.want)
		}
	}
}
