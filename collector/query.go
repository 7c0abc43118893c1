package collector

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/gpulet/gpulet/api"
)

// Row is one node and GPU of GET /v1/table.
type Row struct {
	Node           string `json:"node"`
	NodeState      string `json:"node_state"`
	GPUIndex       int    `json:"gpu_index"`
	GPUUUID        string `json:"gpu_uuid"`
	Name           string `json:"name"`
	GPUState       string `json:"gpu_state"`
	Eligible       bool   `json:"eligible"`
	UnitsTotal     int    `json:"units_total"`
	UnitsUsed      int    `json:"units_used"`
	UnitsFree      int    `json:"units_free"`
	UnitsReserved  int    `json:"units_reserved"`
	UtilizationPct int    `json:"utilization_pct"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	MemoryUsedMiB  uint64 `json:"memory_used_mib"`
}

// Table is the body of GET /v1/table.
type Table struct {
	Rows []Row `json:"rows"`
	// NextOffset, present when more rows match than this answer holds, is
	// the offset parameter that asks for the next ones.
	NextOffset int `json:"next_offset,omitempty"`
}

// DefaultMaxTableRows bounds the rows of one answer of GET /v1/table (about
// 3 MB of JSON): a larger table is read a page at a time, with offset.
const DefaultMaxTableRows = 10000

// maxQueryCount bounds limit and offset, far above any table's rows, so
// that their sum cannot overflow.
const maxQueryCount = 1 << 30

// Orders of a table query.
const (
	OrderMostFree  = "most_free"
	OrderLeastFree = "least_free"
)

// Query selects and orders table rows; its zero value is every row, by node
// then GPU index.
type Query struct {
	// Node keeps the rows of the node so named.
	Node string
	// Type keeps the GPUs whose name holds it, ignoring case.
	Type string
	// MinFree keeps the rows with at least this many free units.
	MinFree int
	// Eligible keeps the eligible GPUs of working nodes.
	Eligible bool
	// Order is "", OrderMostFree or OrderLeastFree.
	Order string
	// Limit keeps the first Limit rows (after Offset); 0: all.
	Limit int
	// Offset skips the first Offset rows of the order.
	Offset int
}

// ParseQuery reads a table query from URL parameters. Unknown parameters
// and bad values are refused with an error naming the parameter.
func ParseQuery(v url.Values) (Query, error) {
	var q Query
	for name, vals := range v {
		if len(vals) != 1 {
			return q, api.Errorf(api.ErrBadRequest, "query parameter %s: given %d times", name, len(vals))
		}
		val := vals[0]
		switch name {
		case "node":
			if val == "" {
				return q, api.Errorf(api.ErrBadRequest, "query parameter node: empty")
			}
			q.Node = val
		case "type":
			if val == "" {
				return q, api.Errorf(api.ErrBadRequest, "query parameter type: empty")
			}
			q.Type = strings.ToLower(val)
		case "min_free":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return q, api.Errorf(api.ErrBadRequest, "query parameter min_free: %q is not a whole number ≥ 0", val)
			}
			q.MinFree = n
		case "eligible":
			b, err := strconv.ParseBool(val)
			if err != nil {
				return q, api.Errorf(api.ErrBadRequest, "query parameter eligible: %q is not true or false", val)
			}
			q.Eligible = b
		case "order":
			if val != OrderMostFree && val != OrderLeastFree {
				return q, api.Errorf(api.ErrBadRequest, "query parameter order: %q is not %s or %s", val, OrderMostFree, OrderLeastFree)
			}
			q.Order = val
		case "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > maxQueryCount {
				return q, api.Errorf(api.ErrBadRequest, "query parameter limit: %q is not a whole number from 1 to %d", val, maxQueryCount)
			}
			q.Limit = n
		case "offset":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > maxQueryCount {
				return q, api.Errorf(api.ErrBadRequest, "query parameter offset: %q is not a whole number from 0 to %d", val, maxQueryCount)
			}
			q.Offset = n
		default:
			return q, api.Errorf(api.ErrBadRequest, "query parameter %s: unknown (known: node, type, min_free, eligible, order, limit, offset)", name)
		}
	}
	return q, nil
}

// match is one selected row before it is turned into a Row: the record
// (for its node's fields) and the GPU's place in it.
type match struct {
	rec *record
	gpu *gpuRecord
	// key is the GPU's key, which comparing reads instead of the record.
	key   *gpuKey
	state string
}

// Table answers q from the rows as they are now.
func (st *Store) Table(q Query) Table {
	recs, now := st.records(q.Node)
	byPlace := func(a, b match) int {
		if c := strings.Compare(a.rec.node, b.rec.node); c != 0 {
			return c
		}
		return cmp.Compare(a.gpu.index, b.gpu.index)
	}
	compare := byPlace
	switch q.Order {
	case OrderMostFree:
		compare = func(a, b match) int {
			if c := cmp.Compare(b.key.free, a.key.free); c != 0 {
				return c
			}
			return byPlace(a, b)
		}
	case OrderLeastFree:
		compare = func(a, b match) int {
			if c := cmp.Compare(a.key.free, b.key.free); c != 0 {
				return c
			}
			return byPlace(a, b)
		}
	}
	// With a limit only the best candidates so far are kept, as the rows
	// are met: the scheduler's "best 20 of 80,000" then neither gathers nor
	// sorts the other 79,980.
	var ms []match
	matched := 0
	if end := q.Offset + q.Limit; q.Limit > 0 && end <= maxTopN {
		best := topN{n: end, compare: compare}
		st.each(recs, now, q, func(m match) { matched++; best.offer(m) })
		ms = best.best
	} else {
		st.each(recs, now, q, func(m match) { ms = append(ms, m) })
		matched = len(ms)
		slices.SortFunc(ms, compare)
	}
	ms = ms[min(q.Offset, len(ms)):]
	if q.Limit > 0 && q.Limit < len(ms) {
		ms = ms[:q.Limit]
	}
	t := Table{Rows: make([]Row, len(ms))}
	if next := q.Offset + len(ms); next < matched {
		t.NextOffset = next
	}
	for i, m := range ms {
		g := m.gpu
		gpuState := g.state
		if m.state == NotWorking {
			gpuState = NotWorking
		}
		t.Rows[i] = Row{
			Node: m.rec.node, NodeState: m.state, GPUIndex: g.index, GPUUUID: g.uuid, Name: g.name,
			GPUState: gpuState, Eligible: m.key.eligible, UnitsTotal: g.unitsTotal, UnitsUsed: g.unitsUsed,
			UnitsFree: m.key.free, UnitsReserved: g.unitsReserved, UtilizationPct: g.utilizationPct,
			MemoryTotalMiB: g.memoryTotalMiB, MemoryUsedMiB: g.memoryUsedMiB,
		}
	}
	return t
}

// each offers keep every row of recs that q selects.
func (st *Store) each(recs []*record, now time.Time, q Query, keep func(match)) {
	typ := nameMatch{typ: q.Type}
	for _, r := range recs {
		state := st.stateAt(r, now)
		if q.Eligible && state != api.NodeWorking {
			continue
		}
		for i := range r.keys {
			k := &r.keys[i]
			if k.free < q.MinFree || (q.Eligible && !k.eligible) ||
				(q.Type != "" && !typ.in(k.lowerName)) {
				continue
			}
			keep(match{rec: r, gpu: &r.gpus[i], key: k, state: state})
		}
	}
}

// nameMatch says whether lower-case GPU names hold a query's type,
// remembering its last few answers by the name's address: names are
// interned (interner.get), so a cluster's GPUs share a few strings, and a
// walk over every GPU asks the same few questions again and again. The
// records walked keep every name alive, so no address is reused meanwhile.
type nameMatch struct {
	typ  string
	seen [4]struct {
		name *byte
		n    int
		in   bool
	}
	next int
}

func (m *nameMatch) in(name string) bool {
	p := unsafe.StringData(name)
	for _, s := range m.seen {
		if s.name == p && s.n == len(name) && p != nil {
			return s.in
		}
	}
	in := strings.Contains(name, m.typ)
	s := &m.seen[m.next]
	s.name, s.n, s.in = p, len(name), in
	m.next = (m.next + 1) % len(m.seen)
	return in
}

// maxTopN is the largest limit answered by keeping the best rows as they come:
// each row that enters moves up to limit others, so a larger limit gathers
// every row and sorts once instead.
const maxTopN = 256

// topN keeps the first n rows offered in compare's order, sorted.
type topN struct {
	n       int
	compare func(a, b match) int
	best    []match
}

// offer keeps m when it is among the n best so far: a candidate enters only
// when it beats the last kept, so most cost one comparison.
func (t *topN) offer(m match) {
	if len(t.best) == t.n && t.compare(m, t.best[t.n-1]) >= 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(t.best, m, t.compare)
	t.best = slices.Insert(t.best, i, m)
	if len(t.best) > t.n {
		t.best = t.best[:t.n]
	}
}
