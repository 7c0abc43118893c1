package config

import (
	"slices"
	"testing"
	"time"

	"github.com/gpulet/gpulet/placement"
)

func TestNilRulesAreNoConfig(t *testing.T) {
	for name, r := range map[string]*Rules{"nil": nil, "zero": {}} {
		if p, ok := r.Pool("training"); ok || p != nil {
			t.Errorf("%s: Pool found %+v", name, p)
		}
		if w := r.ScoreWeights(); w != (placement.Weights{CC: 1.0 / 3, Bandwidth: 1.0 / 3, Clock: 1.0 / 3}) {
			t.Errorf("%s: weights %+v", name, w)
		}
	}
	var p *placement.Pool
	if p.Allows(0, nil) {
		t.Error("a nil pool allows")
	}
}

// rules is a node with GPUs 0-3: 0 and 1 in training (alice, group ml), 1
// and 2 also in shared (everyone), 3 in no pool, and a pool for admins only.
func rules(t *testing.T) *Rules {
	t.Helper()
	r, err := mustParse(t, lines(
		"pools:",
		"  training: {gpus: [0, 1], users: [alice, 'group:ml']}",
		"  shared: {gpus: [1, 2]}",
		"  admins: {gpus: [0], users: []}",
		"quotas: {alice: 8, 'group:ml': 24, '*': 64}",
		"profiles: {resnet50: {Tesla T4: 410s}}",
		"score: {cc: 2}",
	)).Resolve([]GPURef{{0, "GPU-a"}, {1, "GPU-b"}, {2, "GPU-c"}, {3, "GPU-d"}}, newDirectory())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPoolAllows(t *testing.T) {
	r := rules(t)
	for _, tc := range []struct {
		pool string
		uid  uint32
		gids []uint32
		want bool
	}{
		{"training", 1001, nil, true},            // alice
		{"training", 1002, []uint32{2000}, true}, // bob, in ml
		{"training", 1002, []uint32{100, 2001}, false},
		{"training", 1003, nil, false},
		{"shared", 1003, nil, true},
		{"admins", 1001, []uint32{2000}, false},
	} {
		p, ok := r.Pool(tc.pool)
		if !ok || p.Name != tc.pool {
			t.Fatalf("Pool(%q): %+v, %v", tc.pool, p, ok)
		}
		if got := p.Allows(tc.uid, tc.gids); got != tc.want {
			t.Errorf("%s allows uid %d groups %v: %v, want %v", tc.pool, tc.uid, tc.gids, got, tc.want)
		}
	}
	if _, ok := r.Pool("inference"); ok {
		t.Error("found a pool the file does not have")
	}
}

func TestRulesProfileAndWeights(t *testing.T) {
	r := rules(t)
	if got := r.Profiles["resnet50"]; len(got) != 1 || got["Tesla T4"] != 410*time.Second {
		t.Fatalf("profile %v", got)
	}
	if q := r.Quotas; len(q) != 3 {
		t.Fatalf("quotas %+v", q)
	}
	if w := r.ScoreWeights(); w != (placement.Weights{CC: 2}) {
		t.Fatalf("weights %+v", w)
	}
}

func TestModelsNotIn(t *testing.T) {
	f, err := Parse([]byte("profiles:\n  a: {Tesla T4: 1s, Tesla-T4: 2s}\n  b: {Tesla-T4: 3s, NVIDIA H100 80GB HBM3: 4s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := f.ModelsNotIn([]string{"Tesla T4", "NVIDIA A100-SXM4-80GB"})
	if want := []string{"NVIDIA H100 80GB HBM3", "Tesla-T4"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
