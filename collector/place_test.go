package collector

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/placement"
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
	// n1 fills up: the answer follows its new snapshot. n2 reports as it
	// was; its record, taken in once placements are asked, comes with its
	// model, made for a working node.
	st.Apply(withInstances(testSnapshot("n1", "b", 2, 0, 2)))
	st.Apply(withInstances(testSnapshot("n2", "b", 2, 3, 2)))
	if code, l, b := place(`{"units":3}`, ""); code != 200 || l.Placements[0].Node != "n2" || l.Placements[0].GPU.Index != 0 {
		t.Fatalf("3 units after n1 filled up: %d %s", code, b)
	}
	// A silent node is not_working: nothing goes there, whatever model
	// came with its last snapshot.
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
		{`{"units":1}}`, "", "trailing data"},
		{`{"units":1}]`, "", "trailing data"},
		{`{"units":1}`, "?node=n1", "only ?limit"},
	} {
		if code, _, b := place(tc.body, tc.query); code != 400 || !strings.Contains(errorMessage(t, b), tc.want) {
			t.Errorf("%s %s: %d %s, want 400 saying %q", tc.body, tc.query, code, b, tc.want)
		}
	}
}

// snapshotFree is node's snapshot whose GPUs of 8 units have free units
// free, one MPS instance each.
func snapshotFree(node string, free ...int) *api.Snapshot {
	s := testSnapshot(node, "b", 1, 0, len(free))
	s.UnitsFree = 0
	for i, f := range free {
		s.GPUs[i].UnitsFree, s.GPUs[i].UnitsUsed = f, 8-f
		s.UnitsFree += f
	}
	return withInstances(s)
}

// learningServer is a collector placing under policy p, learning from
// the callers of tokens (a --learn-tokens-file), with nodes in its table.
func learningServer(t *testing.T, p placement.Policy, tokens string, nodes ...*api.Snapshot) *Server {
	t.Helper()
	st := NewStore(15*time.Second, nil)
	s := NewServer(st, nil)
	s.SetPolicy(p)
	s.Auth.LearnTokens = callerTokensFile(t, tokens)
	for _, n := range nodes {
		st.Apply(n)
	}
	return s
}

// TestPlacementsLearnMix: under frag the collector weighs the mix of the
// requests it has been asked. A request of 2 units goes, by best-fit, to
// the tightest GPU (n1's GPU 0, 4 free). Once requests of 4 units are the
// mix, frag keeps that GPU for them, as its 2 left would fit none, and
// takes GPUs that keep 4 free: n2's (6), then n1's GPU 1 (8). Before the
// 4s, the mix is the request's own shape, which no choice fragments: frag
// ranks as best-fit. The answers of 2 units the nodes kept under the first
// mix must not outlive it. The requests come from a caller the collector
// learns from (--learn-tokens-file).
func TestPlacementsLearnMix(t *testing.T) {
	server := func(p placement.Policy) *Server {
		return learningServer(t, p, "sched t0k\n", snapshotFree("n1", 4, 8), snapshotFree("n2", 6))
	}
	place := func(s *Server, body string) string {
		t.Helper()
		code, b := doAs(t, s, "Bearer t0k", "POST", "/v1/placements?limit=3", body)
		var l PlacementList
		if code != 200 || json.Unmarshal(b, &l) != nil {
			t.Fatalf("%s: %d %s", body, code, b)
		}
		got := []string{}
		for _, p := range l.Placements {
			got = append(got, fmt.Sprintf("%s/%d", p.Node, p.GPU.Index))
		}
		return l.Policy + " " + strings.Join(got, " ")
	}
	bestFit, frag := server(placement.BestFit), server(placement.Frag)
	if got, want := place(bestFit, `{"units":2}`), "best-fit n1/0 n2/0"; got != want {
		t.Fatalf("best-fit: %s, want %s", got, want)
	}
	if got, want := place(frag, `{"units":2}`), "frag n1/0 n2/0"; got != want {
		t.Fatalf("frag before it learnt requests of 4 units: %s, want %s, as best-fit", got, want)
	}
	// Requests of 4 units until a new mix is published (the learner
	// publishes every so many requests), which must weigh them most.
	for n := 0; ; n++ {
		if m := learnedMix(t, frag); len(m.Shapes) > 0 && m.Shapes[0].Units == 4 {
			break
		} else if n > 10000 {
			t.Fatalf("after %d requests of 4 units the mix is %+v", n, m)
		}
		place(frag, `{"units":4}`)
		place(bestFit, `{"units":4}`)
	}
	if got, want := place(bestFit, `{"units":2}`), "best-fit n1/0 n2/0"; got != want {
		t.Fatalf("best-fit after requests of 4 units: %s, want %s", got, want)
	}
	if got, want := place(frag, `{"units":2}`), "frag n2/0 n1/1"; got != want {
		t.Fatalf("frag after requests of 4 units: %s, want %s", got, want)
	}
}

// learnedMix is the answer of GET /v1/placements/mix.
func learnedMix(t *testing.T, s *Server) PlacementMix {
	t.Helper()
	code, b := do(t, s, "GET", "/v1/placements/mix", nil)
	var m PlacementMix
	if code != 200 || json.Unmarshal(b, &m) != nil {
		t.Fatalf("GET /v1/placements/mix: %d %s", code, b)
	}
	return m
}

// doAs is do with an Authorization header, auth.
func doAs(t *testing.T, h http.Handler, auth, method, target, body string) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Header.Set("Authorization", auth)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// TestPlacementsLearnOncePlaced: a request is learnt once it has been
// placed, so the first one under frag is placed with no mix, as best-fit
// (2 units to the tighter GPU of 3 free), and the next under a mix of its
// shape (to the GPU of 5, rather than leave 1 no request of 2 can use).
func TestPlacementsLearnOncePlaced(t *testing.T) {
	s := learningServer(t, placement.Frag, "sched t0k\n", snapshotFree("n1", 3, 5))
	for i, want := range []int{0, 1} {
		code, b := doAs(t, s, "Bearer t0k", "POST", "/v1/placements", `{"units":2}`)
		var l PlacementList
		if code != 200 || json.Unmarshal(b, &l) != nil || l.Placements[0].GPU.Index != want {
			t.Errorf("request %d: %d %s, want GPU %d", i+1, code, b, want)
		}
	}
}

// TestPlacementsLearnOnlyFromNamedCallers: the collector learns only the
// requests of callers it can name (--learn-tokens-file), once placed, each
// caller's within its share (placement.UserShare): 1,100 requests with no
// token (no read token is set, so they are placed) and a request no node
// fits leave the mix as it was; one caller's flood makes half of the mix
// beside one other caller.
func TestPlacementsLearnOnlyFromNamedCallers(t *testing.T) {
	s := learningServer(t, placement.Frag, "a ta\nb tb\n", snapshotFree("n1", 4, 8))
	post := func(auth, body string, want int) {
		t.Helper()
		if code, b := doAs(t, s, auth, "POST", "/v1/placements", body); code != want {
			t.Fatalf("%s with %q: %d %s, want %d", body, auth, code, b, want)
		}
	}
	for range 1100 {
		post("", `{"units":1}`, 200)
	}
	post("Bearer nope", `{"units":1}`, 200)
	post("Bearer ta", `{"gpus":2}`, 409)
	if m := learnedMix(t, s); m.Observed != 0 || len(m.Shapes) != 0 {
		t.Fatalf("after requests of no caller named and one refused: %+v, want nothing learnt", m)
	}
	post("Bearer tb", `{"units":4}`, 200)
	for range 1100 {
		post("Bearer ta", `{"units":2}`, 200)
	}
	m := learnedMix(t, s)
	want := []MixShape{{Units: 2, Weight: 0.5}, {Units: 4, Weight: 0.5}}
	if m.Observed != 1101 || !slices.Equal(m.Shapes, want) {
		t.Fatalf("b's one request and a's 1,100: %+v, want %v", m, want)
	}
}

// TestPlacementMix: GET /v1/placements/mix shows the mix as last published,
// learnt from the requests of POST /v1/placements placed for a caller of
// --learn-tokens-file only, under any policy (TestReadToken: it needs the
// read token where one is set).
func TestPlacementMix(t *testing.T) {
	s := learningServer(t, placement.BestFit, "sched t0k\n", snapshotFree("n1", 4, 8))
	get := func() string {
		t.Helper()
		code, b := do(t, s, "GET", "/v1/placements/mix", nil)
		if code != 200 {
			t.Fatalf("GET /v1/placements/mix: %d %s", code, b)
		}
		return strings.TrimSpace(string(b))
	}
	if got, want := get(), `{"policy":"best-fit","observed":0,"shapes":[]}`; got != want {
		t.Fatalf("before any request: %s, want %s", got, want)
	}
	for _, step := range []struct {
		body string
		code int
		want string
	}{
		// Refused: no node fits it; not learnt.
		{`{"gpus":2,"memory_mib":100}`, 409, `{"policy":"best-fit","observed":0,"shapes":[]}`},
		{`{"units":2,"pool":"p"}`, 400, `{"policy":"best-fit","observed":0,"shapes":[]}`},
		// The first request placed publishes a mix of its shape.
		{`{"units":2,"type":"T4"}`, 200, `{"policy":"best-fit","observed":1,"shapes":[{"units":2,"type":"T4","weight":1}]}`},
		// Counted, and in the next mix published.
		{`{"gpus":1}`, 200, `{"policy":"best-fit","observed":2,"shapes":[{"units":2,"type":"T4","weight":1}]}`},
	} {
		if code, b := doAs(t, s, "Bearer t0k", "POST", "/v1/placements", step.body); code != step.code {
			t.Fatalf("%s: %d %s, want %d", step.body, code, b, step.code)
		}
		if got := get(); got != step.want {
			t.Fatalf("after %s: %s, want %s", step.body, got, step.want)
		}
	}
	if code, b := do(t, s, "GET", "/v1/placements/mix?x=1", nil); code != 400 || !strings.Contains(errorMessage(t, b), "no query parameters") {
		t.Fatalf("with a query: %d %s", code, b)
	}
}

// TestChangesBetweenPlacementsAreBounded: once placements are asked, the
// table lists the nodes that changed since the last; nodes coming and going
// (made-up ones, forgotten after --expire-after) between two placements must
// not grow that list past the table, and the next placement still sees
// only the nodes there are.
func TestChangesBetweenPlacementsAreBounded(t *testing.T) {
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	s := NewServer(st, nil)
	place := func() PlacementList {
		t.Helper()
		code, b := do(t, s, "POST", "/v1/placements?limit=100", []byte(`{"units":1}`))
		var l PlacementList
		if code != 200 || json.Unmarshal(b, &l) != nil {
			t.Fatalf("placement: %d %s", code, b)
		}
		return l
	}
	st.Apply(snapshotFree("stays", 4))
	place()
	for round := range 50 {
		for i := range 20 {
			st.Apply(snapshotFree(fmt.Sprintf("made-up-%d-%d", round, i), 4))
		}
		if round == 0 {
			// Modeled, then gone while the list is dropped.
			place()
		}
		clock.Add(time.Minute)
		s := snapshotFree("stays", 4)
		s.Seq = uint64(round + 2)
		st.Apply(s)
		st.Expire(30 * time.Second)
		st.mu.RLock()
		listed, nodes := len(st.changed), len(st.nodes)
		st.mu.RUnlock()
		if listed > 21 {
			t.Fatalf("round %d: %d nodes listed as changed, %d in the table", round, listed, nodes)
		}
	}
	if l := place(); l.Nodes != 1 || len(l.Placements) != 1 || l.Placements[0].Node != "stays" {
		t.Fatalf("after the made-up nodes went: %+v", l)
	}
}

// TestPlacementsSeeHeldMemory: the collector sees a GPU's memory as its node
// does: what its leases hold is not free, used or not (docs/design.md §1.8).
func TestPlacementsSeeHeldMemory(t *testing.T) {
	st := NewStore(15*time.Second, newFakeClock().Now)
	s := NewServer(st, nil)
	snap := withInstances(testSnapshot("n1", "b", 1, 6, 1))
	snap.GPUs[0].MemoryUsedMiB = 0
	st.Apply(snap)
	body := []byte(`{"units":1,"memory_mib":20000}`)
	if code, b := do(t, s, "POST", "/v1/placements", body); code != 200 {
		t.Fatalf("20000 MiB on a GPU that holds nothing: %d %s", code, b)
	}
	snap = withInstances(testSnapshot("n1", "b", 2, 6, 1))
	snap.GPUs[0].MemoryUsedMiB, snap.GPUs[0].MemoryHeldMiB = 0, 70000
	st.Apply(snap)
	if code, b := do(t, s, "POST", "/v1/placements", body); code != 409 {
		t.Fatalf("20000 MiB on a GPU that holds 70000 of its 81920: %d %s", code, b)
	}
}

// TestMixInForceOnceMoved: under frag, a mix published is put in force only
// when it has moved from the one in force by cluster.MixMove: the same
// requests again leave the one in force as it was, while the learner has
// published anew; a shape that comes in with a tenth of the requests puts
// a new one in force. GET /v1/placements/mix shows the one in force.
func TestMixInForceOnceMoved(t *testing.T) {
	s := learningServer(t, placement.Frag, "sched t0k\n", snapshotFree("n1", 8, 8))
	post := func(n int, bodies ...string) {
		t.Helper()
		for i := range n {
			if code, b := doAs(t, s, "Bearer t0k", "POST", "/v1/placements", bodies[i%len(bodies)]); code != 200 {
				t.Fatalf("%s: %d %s", bodies[i%len(bodies)], code, b)
			}
		}
	}
	// The first mix (of the first request) and the next, published 1,024
	// requests after it, which moved from a shape to two.
	post(1025, `{"units":2}`, `{"units":4}`)
	inForce := learnedMix(t, s)
	if len(inForce.Shapes) != 2 || s.placer.mix != s.placer.learner.Mix() {
		t.Fatalf("after 1,025 requests of 2 and 4 units: %+v in force", inForce)
	}
	post(1024, `{"units":4}`, `{"units":2}`)
	if s.placer.learner.Mix() == s.placer.mix {
		t.Fatal("the learner published no new mix in 1,024 requests")
	}
	if got := learnedMix(t, s); !slices.Equal(got.Shapes, inForce.Shapes) {
		t.Fatalf("the same requests again: %+v in force, want %+v as it was", got.Shapes, inForce.Shapes)
	}
	post(1024, `{"units":2}`, `{"units":4}`, `{"units":2}`, `{"units":4}`, `{"units":2}`, `{"units":4}`, `{"units":2}`, `{"units":4}`, `{"units":2}`, `{"gpus":1}`)
	if got := learnedMix(t, s); len(got.Shapes) != 3 || s.placer.mix != s.placer.learner.Mix() {
		t.Fatalf("with whole GPUs a tenth of the requests: %+v in force, want three shapes", got.Shapes)
	}
}

// TestUnitRange: a model's free units are the range asked, shared where
// they are small, made where they are not, whatever a snapshot names.
func TestUnitRange(t *testing.T) {
	for _, tc := range []struct{ first, n int }{
		{0, 0}, {0, 8}, {4088, 8}, {4090, 8}, {-3, 2}, {math.MaxInt - 1, 4}, {1 << 40, 1},
	} {
		got := unitRange(tc.first, tc.n)
		if len(got) != tc.n || cap(got) != tc.n {
			t.Fatalf("unitRange(%d, %d): len %d, cap %d", tc.first, tc.n, len(got), cap(got))
		}
		for u, v := range got {
			if v != tc.first+u {
				t.Fatalf("unitRange(%d, %d)[%d] = %d", tc.first, tc.n, u, v)
			}
		}
	}
}
