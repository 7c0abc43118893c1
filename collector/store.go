package collector

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/placement"
)

// NotWorking is the state of a node that has sent nothing for the stale
// period, and of its GPUs.
const NotWorking = "not_working"

// record is what the collector keeps of one node: the fields of its last
// applied snapshot that the table shows. A record is immutable once stored;
// a newer snapshot replaces the whole record, so that a reader sees a node's
// old rows or its new ones, never a mix.
type record struct {
	// First what a query reads of every node, so that a walk over the whole
	// table touches few cache lines per node.
	received time.Time
	state    string
	// keys are what a query filters each GPU on, in the order of gpus: in
	// inlineKeys when they fit, so that a query's walk reads the node from
	// one allocation.
	keys       []gpuKey
	inlineKeys [inlineGPUs]gpuKey

	node          string
	bootID        string
	seq           uint64
	unitsTotal    int
	unitsFree     int
	unitsReserved int
	gpus          []gpuRecord
	// size is recordSize's estimate of the memory the record takes.
	size int
	// model is the placement engine's view of the node in the state it
	// reported (modelOf), made as the snapshot is taken in once
	// placements are asked, so that a placement, one at a time, does not
	// make it; nil before.
	model *placement.Node
}

type gpuRecord struct {
	index          int
	uuid           string
	name           string
	state          string
	unitsTotal     int
	unitsUsed      int
	unitsReserved  int
	utilizationPct int
	memoryTotalMiB uint64
	memoryUsedMiB  uint64
	memoryHeldMiB  uint64
	// What the placements need beside the table's columns: the card's
	// figures and each MPS instance's state and free units.
	card      placement.Card
	instances []instanceRecord
}

// gpuKey is what a query filters a GPU on (the rest is in its gpuRecord,
// at the same place of gpus), kept apart: a query walks every GPU of the
// cluster, and 10,000 nodes' GPU records are megabytes, each GPU on lines of
// its own, where their keys are a few lines per node.
type gpuKey struct {
	lowerName string
	free      int
	eligible  bool
}

// instanceRecord is one MPS instance of a GPU: its units are the range
// [first, first+size), as every instance's are.
type instanceRecord struct {
	state               string
	first, size, free   int
	clients, clientsMax int
}

// Outcome is what Store.Apply did with a snapshot.
type Outcome int

const (
	// Applied: the snapshot replaced the node's rows (or made them).
	Applied Outcome = iota
	// Repeated: the snapshot has the seq of the node's rows (an idle node
	// resending): the rows stay, the node counts as heard from.
	Repeated
	// Dropped: the snapshot is older than the node's rows (same boot_id,
	// seq below the last) and was ignored. The node's own pushes never go
	// back, so it is told: someone else may be pushing as it.
	Dropped
	// Full: the snapshot is of a node the table has no room for (MaxNodes,
	// MaxBytes).
	Full
)

// DefaultMaxNodes bounds the nodes the table keeps: 100,000 nodes of 8 GPUs
// take about 170 MiB; a sender of made-up node names can take no more.
const DefaultMaxNodes = 100000

// DefaultMaxBytes bounds the memory the table's records take, by estimate
// (recordSize): three times what 100,000 nodes of 8 GPUs take, and a
// thousandth of what a sender of 100,000 nodes of 256 GPUs with long names
// would.
const DefaultMaxBytes = 512 << 20

// DefaultExpireAfter is how long a node may be silent before its rows are
// forgotten: long enough for a reboot, short enough that made-up nodes do
// not hold the table's room for long.
const DefaultExpireAfter = 10 * time.Minute

// Store is the resource table: one record per node. Snapshots are decoded
// and turned into records before the lock is taken, so the write lock is
// held only to compare seqs and swap one pointer; readers hold the read lock
// only to copy the pointers they need.
type Store struct {
	staleAfter time.Duration
	now        func() time.Time
	names      interner

	// mu guards nodes, bytes and changed; the records nodes points to are
	// immutable.
	mu    sync.RWMutex
	nodes map[string]*record
	// changed names the nodes whose record changed or went since the
	// placements last asked (takeChanged); nil until they first do, so a
	// collector nobody asks for placements keeps no such list, and nil
	// again once it outgrew the table (noteChanged).
	changed map[string]struct{}
	// placing is set once placements have asked for changes: from then
	// on each record comes with its model.
	placing atomic.Bool
	// bytes is the sum of the records' recordSize.
	bytes int
	// MaxNodes, when above zero, is the most nodes the table keeps; a
	// snapshot of another node is refused once it is full.
	MaxNodes int
	// MaxBytes, when above zero, bounds the sum of the records' sizes: a
	// snapshot that would pass it is refused.
	MaxBytes int
}

// NewStore returns an empty table in which a node silent for staleAfter is
// not_working; now is the clock (time.Now when nil).
func NewStore(staleAfter time.Duration, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{staleAfter: staleAfter, now: now, nodes: make(map[string]*record)}
}

// Apply stores s as its node's rows unless the node already has rows of the
// same boot_id with a seq at least as high. A new boot_id is always applied:
// the daemon restarted and counts seq from 1 again. The same seq again is a
// node resending an unchanged snapshot (an idle node does so every report
// interval): its rows stay as they are, but it counts as a report, so that an
// idle node is never taken for a silent one.
func (st *Store) Apply(s *api.Snapshot) Outcome {
	rec := st.recordOf(s)
	if st.placing.Load() {
		rec.model = modelOf(rec, rec.state)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.nodes[rec.node]
	if old == nil && st.MaxNodes > 0 && len(st.nodes) >= st.MaxNodes {
		return Full
	}
	if old != nil && !api.SnapshotNewer(rec.bootID, rec.seq, old.bootID, old.seq) {
		if rec.seq < old.seq {
			return Dropped
		}
		st.nodes[rec.node] = old.heardAt(rec.received)
		// Heard from: a node judged silent is working again.
		st.noteChanged(rec.node)
		return Repeated
	}
	grows := rec.size
	if old != nil {
		grows -= old.size
	}
	if st.MaxBytes > 0 && grows > 0 && st.bytes+grows > st.MaxBytes {
		return Full
	}
	st.bytes += grows
	st.nodes[rec.node] = rec
	st.noteChanged(rec.node)
	return Applied
}

// Expire forgets the nodes silent for after or longer, and returns how many.
func (st *Store) Expire(after time.Duration) int {
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	for name, r := range st.nodes {
		if now.Sub(r.received) >= after {
			delete(st.nodes, name)
			st.noteChanged(name)
			st.bytes -= r.size
			n++
		}
	}
	return n
}

// Bytes is the estimated memory the records take (what MaxBytes bounds).
func (st *Store) Bytes() int {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.bytes
}

// Sizes for recordSize: a record and a GPU's, and what a map entry of the
// table costs besides.
const (
	recordBytes   = int(unsafe.Sizeof(record{}))
	gpuRecordSize = int(unsafe.Sizeof(gpuRecord{}))
	gpuKeySize    = int(unsafe.Sizeof(gpuKey{}))
	// inlineGPUs is how many GPUs' keys a record holds in itself: 8, the
	// most GPUs of common nodes.
	inlineGPUs = 8
	// instanceRecordSize counts an instance's record; its state string,
	// interned when common, is counted apart (recordSize).
	instanceRecordSize = int(unsafe.Sizeof(instanceRecord{}))
	mapEntryBytes      = 64
	intSize            = int(unsafe.Sizeof(0))
)

// recordSize estimates the memory r takes, its strings included (a shared
// GPU name counted as if it were not: an overestimate bounds safely), and
// the part of its placement model that is no record's (modelOf's free
// lists; the model's GPUs and instances take about what the record's do).
func recordSize(r *record) int {
	n := recordBytes + mapEntryBytes + len(r.node) + len(r.bootID) + len(r.gpus)*gpuRecordSize
	if len(r.keys) > inlineGPUs {
		n += len(r.keys) * gpuKeySize
	}
	for i := range r.gpus {
		g := &r.gpus[i]
		n += len(g.uuid) + len(g.name) + len(r.keys[i].lowerName) + len(g.instances)*instanceRecordSize
		for k := range g.instances {
			// A state past the interner's vocabulary is the record's own,
			// and the placements' model of the node lists each free unit
			// (modelOf): a word a unit, where the body spends two bytes.
			n += len(g.instances[k].state) + g.instances[k].free*intSize
		}
	}
	return n
}

func (st *Store) recordOf(s *api.Snapshot) *record {
	rec := &record{
		// Copies: the decoder's strings may share the memory of the whole
		// body, which the table must not keep alive.
		node: strings.Clone(s.Node), bootID: strings.Clone(s.BootID), seq: s.Seq, received: st.now(), state: st.names.state(s.State),
		unitsTotal: s.UnitsTotal, unitsFree: s.UnitsFree, unitsReserved: s.UnitsReserved,
		gpus: make([]gpuRecord, len(s.GPUs)),
	}
	if len(s.GPUs) <= inlineGPUs {
		rec.keys = rec.inlineKeys[:len(s.GPUs)]
	} else {
		rec.keys = make([]gpuKey, len(s.GPUs))
	}
	// Rows come out by GPU index; taking the GPUs in that order here, once
	// per snapshot, keeps the queries from sorting.
	order := make([]int, len(s.GPUs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(s.GPUs[a].Index, s.GPUs[b].Index) })
	for i, from := range order {
		g := &s.GPUs[from]
		name, lower := st.names.get(g.Name)
		rec.keys[i] = gpuKey{lowerName: lower, free: g.UnitsFree, eligible: g.Eligible}
		rec.gpus[i] = gpuRecord{
			index: g.Index, uuid: strings.Clone(g.UUID), name: name, state: st.names.state(g.State),
			unitsTotal: g.UnitsTotal, unitsUsed: g.UnitsUsed,
			unitsReserved: g.UnitsReserved, utilizationPct: g.UtilizationPct,
			memoryTotalMiB: g.MemoryTotalMiB, memoryUsedMiB: g.MemoryUsedMiB, memoryHeldMiB: g.MemoryHeldMiB,
			card:      cardOf(g.Capability),
			instances: make([]instanceRecord, len(g.Instances)),
		}
		for k, in := range g.Instances {
			first := 0
			if len(in.Units) > 0 {
				first = in.Units[0]
			}
			rec.gpus[i].instances[k] = instanceRecord{state: st.names.state(in.State), first: first, size: len(in.Units),
				free: min(max(in.UnitsFree, 0), len(in.Units)), clients: in.Clients, clientsMax: in.ClientsMax}
		}
	}
	rec.size = recordSize(rec)
	return rec
}

// heardAt is a copy of r received at t: records are read without the lock,
// so one in the table is never changed. Keys held in r itself are the copy's
// own, so that the copy does not keep r alive.
func (r *record) heardAt(t time.Time) *record {
	seen := *r
	seen.received = t
	if len(r.keys) <= inlineGPUs {
		seen.keys = seen.inlineKeys[:len(r.keys)]
	}
	return &seen
}

// noteChanged lists node as changed, while placements follow changes. A
// list naming more nodes than the table holds (nodes coming and going, made-up
// ones forgotten, faster than placements are asked) is dropped: every node
// then counts as changed, as before the first placement, which costs the
// placements no more than the list would, and keeps the list within the
// table. Called with mu held, after the table changed.
func (st *Store) noteChanged(node string) {
	if st.changed == nil {
		return
	}
	st.changed[node] = struct{}{}
	if len(st.changed) > len(st.nodes) {
		st.changed = nil
	}
}

// takeChanged returns the records of the nodes that changed since the last
// call (nil for a node that went), and starts the next list; all is set on
// the first call, and after a list was dropped (noteChanged), when every
// node counts as changed and those that went are not named.
func (st *Store) takeChanged() (changed map[string]*record, all bool) {
	st.placing.Store(true)
	st.mu.Lock()
	defer st.mu.Unlock()
	all = st.changed == nil
	out := make(map[string]*record, len(st.changed))
	if all {
		for name, r := range st.nodes {
			out[name] = r
		}
	}
	for name := range st.changed {
		out[name] = st.nodes[name]
	}
	st.changed = map[string]struct{}{}
	return out, all
}

// records returns the records of every node, or of the one named, in no
// order, and the time they are judged at.
func (st *Store) records(node string) ([]*record, time.Time) {
	st.mu.RLock()
	var out []*record
	if node != "" {
		if r := st.nodes[node]; r != nil {
			out = []*record{r}
		}
	} else {
		out = make([]*record, 0, len(st.nodes))
		for _, r := range st.nodes {
			out = append(out, r)
		}
	}
	st.mu.RUnlock()
	return out, st.now()
}

// stateAt is the node's state at now: not_working once it has been silent
// for the stale period, else what it said (working, draining or degraded).
func (st *Store) stateAt(r *record, now time.Time) string {
	if now.Sub(r.received) >= st.staleAfter {
		return NotWorking
	}
	return r.state
}

// Node is one node of GET /v1/nodes.
type Node struct {
	Node          string    `json:"node"`
	State         string    `json:"state"`
	BootID        string    `json:"boot_id"`
	Seq           uint64    `json:"seq"`
	LastSeen      time.Time `json:"last_seen"`
	UnitsTotal    int       `json:"units_total"`
	UnitsFree     int       `json:"units_free"`
	UnitsReserved int       `json:"units_reserved"`
	GPUs          int       `json:"gpus"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Nodes lists every node known, by name.
func (st *Store) Nodes() NodeList {
	recs, now := st.records("")
	slices.SortFunc(recs, func(a, b *record) int { return strings.Compare(a.node, b.node) })
	out := NodeList{Nodes: make([]Node, len(recs))}
	for i, r := range recs {
		out.Nodes[i] = Node{
			Node: r.node, State: st.stateAt(r, now), BootID: r.bootID, Seq: r.seq, LastSeen: r.received,
			UnitsTotal: r.unitsTotal, UnitsFree: r.unitsFree, UnitsReserved: r.unitsReserved, GPUs: len(r.gpus),
		}
	}
	return out
}

// Counts are the figures /metrics shows of the table.
type Counts struct {
	// NodesByState counts nodes by their state now.
	NodesByState map[string]int
	Rows         int
}

// Counts counts nodes by state and table rows.
func (st *Store) Counts() Counts {
	recs, now := st.records("")
	c := Counts{NodesByState: map[string]int{api.NodeWorking: 0, api.NodeDraining: 0, api.NodeDegraded: 0, NotWorking: 0}}
	for _, r := range recs {
		c.NodesByState[st.stateAt(r, now)]++
		c.Rows += len(r.gpus)
	}
	return c
}

// interner shares the strings that repeat across nodes (GPU names and
// states), so that 10,000 nodes of the same model keep one copy of its name.
type interner struct {
	m sync.Map // string → *[2]string: the name and its lower case
	n atomic.Int64
}

func (in *interner) get(s string) (name, lower string) {
	if v, ok := in.m.Load(s); ok {
		p := v.(*[2]string)
		return p[0], p[1]
	}
	// Only a bounded vocabulary is worth sharing; an unusual name (a
	// sender making up names) is kept as it is, not remembered forever.
	// The decoder's strings may share the memory of the whole body: what
	// the table keeps is copied out.
	s = strings.Clone(s)
	if in.n.Load() >= maxInterned {
		return s, strings.ToLower(s)
	}
	v, loaded := in.m.LoadOrStore(s, &[2]string{s, strings.ToLower(s)})
	if !loaded {
		in.n.Add(1)
	}
	p := v.(*[2]string)
	return p[0], p[1]
}

func (in *interner) state(s string) string {
	name, _ := in.get(s)
	return name
}

// maxInterned bounds the interner: a cluster has tens of GPU models.
const maxInterned = 1024
