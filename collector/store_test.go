package collector

import (
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gpulet/gpulet/api"
)

// testSnapshot is a node of n GPUs, alternately A100 and T4, each with
// free units, free-1 and so on down from free.
func testSnapshot(node, boot string, seq uint64, free, n int) *api.Snapshot {
	s := &api.Snapshot{
		Schema: api.SnapshotSchema, Node: node, BootID: boot, Seq: seq, State: api.NodeWorking,
		Backend: api.BackendSimulated, MPS: "off",
	}
	for i := 0; i < n; i++ {
		name := "NVIDIA A100-SXM4-80GB"
		if i%2 == 1 {
			name = "Tesla T4"
		}
		f := max(free-i, 0)
		s.GPUs = append(s.GPUs, api.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Name: name, State: api.GPUWorking, Eligible: true,
			UnitsTotal: 8, UnitsUsed: 8 - f, UnitsFree: f, UtilizationPct: 10 * i, MaxUtilizationPct: 90,
			MemoryTotalMiB: 81920, MemoryUsedMiB: uint64(1000 * i),
		})
		s.UnitsTotal += 8
		s.UnitsFree += f
	}
	return s
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestApplyReplaceStaleBoot(t *testing.T) {
	st := NewStore(time.Minute, nil)
	steps := []struct {
		name     string
		boot     string
		seq      uint64
		free     int
		want     Outcome
		wantSeq  uint64
		wantFree int
	}{
		{"first", "b1", 5, 4, Applied, 5, 4},
		{"newer", "b1", 6, 3, Applied, 6, 3},
		{"same seq", "b1", 6, 8, Repeated, 6, 3},
		{"older (reordered)", "b1", 2, 8, Dropped, 6, 3},
		{"skips ahead", "b1", 10, 2, Applied, 10, 2},
		{"new boot, lower seq", "b2", 1, 7, Applied, 1, 7},
		{"old boot again is a new boot_id too", "b1", 11, 1, Applied, 11, 1},
	}
	for _, s := range steps {
		if got := st.Apply(testSnapshot("n1", s.boot, s.seq, s.free, 2)); got != s.want {
			t.Fatalf("%s: outcome %v, want %v", s.name, got, s.want)
		}
		n := st.Nodes().Nodes
		if len(n) != 1 || n[0].Seq != s.wantSeq || n[0].BootID != s.boot && s.want == Applied {
			t.Fatalf("%s: nodes %+v", s.name, n)
		}
		if rows := st.Table(Query{}).Rows; rows[0].UnitsFree != s.wantFree {
			t.Fatalf("%s: GPU 0 free %d, want %d", s.name, rows[0].UnitsFree, s.wantFree)
		}
	}
}

func TestStaleness(t *testing.T) {
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	st.Apply(testSnapshot("n1", "b", 1, 4, 2))
	d := testSnapshot("n2", "b", 1, 4, 1)
	d.State = api.NodeDraining
	st.Apply(d)
	g := testSnapshot("n3", "b", 1, 4, 1)
	g.State, g.Reason = api.NodeDegraded, "cannot write the ledger"
	st.Apply(g)
	states := func() map[string]string {
		m := map[string]string{}
		for _, n := range st.Nodes().Nodes {
			m[n.Node] = n.State
		}
		for _, r := range st.Table(Query{}).Rows {
			want := r.NodeState
			if want != NotWorking {
				want = api.GPUWorking
			}
			if r.GPUState != want {
				t.Errorf("%s GPU %d: gpu_state %q with node_state %q", r.Node, r.GPUIndex, r.GPUState, r.NodeState)
			}
		}
		return m
	}
	check := func(when string, want map[string]string) {
		t.Helper()
		got := states()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s is %q, want %q", when, k, got[k], v)
			}
		}
	}
	check("at once", map[string]string{"n1": "working", "n2": "draining", "n3": "degraded"})
	clock.Add(14 * time.Second)
	st.Apply(testSnapshot("n1", "b", 2, 4, 2))
	check("14s later", map[string]string{"n1": "working", "n2": "draining", "n3": "degraded"})
	clock.Add(time.Second)
	check("15s later", map[string]string{"n1": "working", "n2": NotWorking, "n3": NotWorking})
	if c := st.Counts(); c.NodesByState[NotWorking] != 2 || c.NodesByState["working"] != 1 || c.Rows != 4 {
		t.Errorf("counts %+v", c)
	}
	// A stale node's rows stay, not_working, and eligible=true hides them.
	if rows := st.Table(Query{Eligible: true}).Rows; len(rows) != 2 || rows[0].Node != "n1" {
		t.Errorf("eligible rows %+v", rows)
	}
	clock.Add(time.Second)
	st.Apply(testSnapshot("n2", "b", 2, 4, 1))
	check("n2 back", map[string]string{"n2": "working"})
	if n := st.Nodes().Nodes[1]; !n.LastSeen.Equal(clock.Now()) {
		t.Errorf("last_seen %v, want the receipt time %v", n.LastSeen, clock.Now())
	}
}

// TestConcurrentApplyAndRead: writers replace nodes while readers query;
// every node a reader sees is one snapshot's rows, never a mix (every GPU of
// a snapshot here carries the snapshot's seq as its memory used).
func TestConcurrentApplyAndRead(t *testing.T) {
	st := NewStore(time.Minute, nil)
	const nodes, seqs = 20, 200
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for seq := uint64(1); seq <= seqs; seq++ {
				for n := w; n < nodes; n += 4 {
					s := testSnapshot(fmt.Sprintf("n%02d", n), "b", seq, int(seq%9), 8)
					for i := range s.GPUs {
						s.GPUs[i].MemoryUsedMiB = seq
					}
					st.Apply(s)
				}
			}
		}(w)
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := 0; r < 2; r++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				seen := map[string]uint64{}
				for _, row := range st.Table(Query{Order: OrderMostFree}).Rows {
					if m, ok := seen[row.Node]; ok && m != row.MemoryUsedMiB {
						t.Errorf("node %s mixes snapshots %d and %d", row.Node, m, row.MemoryUsedMiB)
						return
					}
					seen[row.Node] = row.MemoryUsedMiB
				}
				st.Nodes()
				st.Counts()
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	for _, n := range st.Nodes().Nodes {
		if n.Seq != seqs {
			t.Errorf("%s ends at seq %d, want %d", n.Node, n.Seq, seqs)
		}
	}
}

// An idle node resends the same snapshot every report interval: its rows are
// not touched, but it stays working, never taken for a silent node.
func TestResendOfTheSameSeqKeepsANodeAlive(t *testing.T) {
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	st.Apply(testSnapshot("n1", "b", 7, 4, 2))
	for range 5 {
		clock.Add(10 * time.Second)
		resent := testSnapshot("n1", "b", 7, 9, 2) // same seq: its rows must not be taken
		if got := st.Apply(resent); got != Repeated {
			t.Fatalf("a resent seq was %v, want repeated", got)
		}
	}
	n := st.Nodes().Nodes[0]
	if n.State != api.NodeWorking || !n.LastSeen.Equal(clock.Now()) {
		t.Fatalf("after 50 s of resends: state %q, last seen %v (now %v)", n.State, n.LastSeen, clock.Now())
	}
	if r := st.Table(Query{}).Rows[0]; r.UnitsFree != 4 {
		t.Fatalf("a resend changed the rows: units_free %d, want 4", r.UnitsFree)
	}
	// The record a resend leaves holds its own query keys: pointing into the
	// record it was copied from would keep that one alive too, uncounted.
	if rec := st.nodes["n1"]; &rec.keys[0] != &rec.inlineKeys[0] {
		t.Fatal("a resent node's record shares its keys with the record before")
	}
	// A lower seq is no report.
	clock.Add(10 * time.Second)
	st.Apply(testSnapshot("n1", "b", 3, 4, 2))
	clock.Add(6 * time.Second)
	if s := st.Nodes().Nodes[0].State; s != NotWorking {
		t.Fatalf("after an old seq only, state %q, want not_working", s)
	}
}

// The table's memory is bounded in bytes: a node past MaxBytes is refused,
// a node already there still updates, and expiry frees the room of nodes
// silent for long.
func TestMaxBytesAndExpiry(t *testing.T) {
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	st.Apply(testSnapshot("n0", "b", 1, 4, 8))
	one := st.Bytes()
	if one < 8*int(unsafe.Sizeof(gpuRecord{})) {
		t.Fatalf("a node of 8 GPUs estimated at %d bytes", one)
	}
	st.MaxBytes = 3*one + one/2
	st.Apply(testSnapshot("n1", "b", 1, 4, 8))
	clock.Add(time.Minute)
	st.Apply(testSnapshot("n2", "b", 1, 4, 8))
	if got := st.Apply(testSnapshot("n3", "b", 1, 4, 8)); got != Full {
		t.Fatalf("a fourth node past --max-bytes: %v, want full", got)
	}
	if got := st.Apply(testSnapshot("n2", "b", 2, 3, 8)); got != Applied {
		t.Fatalf("a node already there: %v", got)
	}
	big := testSnapshot("n2", "b", 3, 3, 8)
	big.GPUs = append(big.GPUs, testSnapshot("x", "b", 1, 1, 64).GPUs[8:]...)
	if got := st.Apply(big); got != Full {
		t.Fatalf("a node growing past --max-bytes: %v, want full", got)
	}
	if n := st.Expire(30 * time.Second); n != 2 {
		t.Fatalf("expired %d nodes, want the 2 silent for a minute", n)
	}
	if got := st.Apply(testSnapshot("n3", "b", 1, 4, 8)); got != Applied {
		t.Fatalf("a new node once others expired: %v", got)
	}
	if st.Bytes() != 2*one || len(st.Nodes().Nodes) != 2 {
		t.Fatalf("%d bytes for %d nodes, want %d", st.Bytes(), len(st.Nodes().Nodes), 2*one)
	}
}

// TestMaxBytesCountsInstanceStates: an instance's state is kept as sent, so
// the estimate --max-bytes bounds counts it; else a sender of made-up
// states of many instances could hold many times --max-bytes.
func TestMaxBytesCountsInstanceStates(t *testing.T) {
	st := NewStore(time.Minute, nil)
	s := testSnapshot("n", "b", 1, 4, 1)
	for k := range 1000 {
		s.GPUs[0].Instances = append(s.GPUs[0].Instances, api.Instance{Instance: k, State: fmt.Sprintf("%0256d", k)})
	}
	if got := st.Apply(s); got != Applied {
		t.Fatalf("apply: %v", got)
	}
	if got, want := st.Bytes(), 1000*256; got < want {
		t.Fatalf("1000 instances of 256-byte states estimated at %d bytes, want at least %d", got, want)
	}
}

// TestMaxBytesCountsFreeUnits: the placements' model of a node lists each
// instance's free units (modelOf), a word each where the snapshot spends two
// bytes, so the estimate --max-bytes bounds counts them.
func TestMaxBytesCountsFreeUnits(t *testing.T) {
	st := NewStore(time.Minute, nil)
	s := withInstances(testSnapshot("n", "b", 1, 4, 1))
	in := &s.GPUs[0].Instances[0]
	in.Units, in.UnitsFree = make([]int, 100000), 100000
	if got := st.Apply(s); got != Applied {
		t.Fatalf("apply: %v", got)
	}
	if got, want := st.Bytes(), 100000*int(unsafe.Sizeof(0)); got < want {
		t.Fatalf("an instance of 100,000 free units estimated at %d bytes, want at least %d", got, want)
	}
	// The defaults still take --max-nodes nodes of 8 GPUs of 16 units,
	// every unit free.
	st = NewStore(time.Minute, nil)
	s = syntheticSnapshot(1)
	for i := range s.GPUs {
		s.GPUs[i].Instances[0].UnitsFree = 16
	}
	st.Apply(s)
	if st.Bytes()*DefaultMaxNodes > DefaultMaxBytes {
		t.Fatalf("a node of 8 free GPUs estimated at %d bytes: %d of them pass --max-bytes", st.Bytes(), DefaultMaxNodes)
	}
}
