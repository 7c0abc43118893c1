package placement

import "testing"

func TestChoose(t *testing.T) {
	cands := []Candidate{
		{GPU: 0, Instance: 0, Free: 8, GPUFree: 12},
		{GPU: 0, Instance: 1, Free: 4, GPUFree: 12},
		{GPU: 1, Instance: 0, Free: 3, GPUFree: 3},
		{GPU: 2, Instance: 0, Free: 16, GPUFree: 16},
	}
	for _, tc := range []struct {
		policy    Policy
		gpu, inst int
	}{
		{BestFit, 1, 0},
		{FirstFit, 0, 0},
		{Spread, 2, 0},
		// No scores: all tie, and best-fit decides.
		{Score, 1, 0},
	} {
		got, ok := choose(tc.policy, cands)
		if !ok || got.GPU != tc.gpu || got.Instance != tc.inst {
			t.Errorf("%s chose %+v, want GPU %d instance %d", tc.policy, got, tc.gpu, tc.inst)
		}
	}
	// Best fit takes the tightest instance on the tightest GPU.
	got, _ := choose(BestFit, cands[:2])
	if got.Instance != 1 {
		t.Errorf("best-fit within a GPU chose instance %d, want 1", got.Instance)
	}
	// Score takes the highest score, whatever the fit, and on that GPU the
	// tightest instance.
	scored := append([]Candidate(nil), cands...)
	scored[0].Score, scored[1].Score, scored[2].Score, scored[3].Score = 1.5, 1.5, 1.2, 1.4
	if got, _ := choose(Score, scored); got.GPU != 0 || got.Instance != 1 {
		t.Errorf("score chose %+v, want GPU 0 instance 1", got)
	}
}

// choose is the best of cands under p, as a decision keeps it.
func choose(p Policy, cands []Candidate) (best Candidate, ok bool) {
	less := p.less()
	for i, c := range cands {
		if i == 0 || less(c, best) {
			best = c
		}
	}
	return best, len(cands) > 0
}

func TestParsePolicy(t *testing.T) {
	for _, p := range Policies {
		if got, err := ParsePolicy(string(p)); err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %q, %v", p, got, err)
		}
	}
	for _, bad := range []string{"", "bestfit", "Score", "scored"} {
		if _, err := ParsePolicy(bad); err == nil {
			t.Errorf("ParsePolicy(%q) accepted", bad)
		}
	}
}
