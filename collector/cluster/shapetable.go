package cluster

import (
	"github.com/google/btree"

	"github.com/gpulet/gpulet/placement"
)

// A frag placement ranks the nodes by their best answer, which a node's
// floor and tie figures bound without asking its engine; a best-fit or
// spread placement by a bound on its GPU's free units (bound.go). A shape
// table keeps those figures for one shape of request, a row a node, and
// the rows that may fit the shape in a B-tree in the order their answers
// would rank at best (rowKey.less). A placement reads again the rows of the nodes
// that changed since the table was last read, then walks the tree from the
// best and asks each node until the next row is beaten by the answers
// kept: every row after it is beaten too. So a placement costs the nodes
// changed and the few asked, not a sweep of every node: at 10,000 nodes and
// 10,000 snapshots a second the sweep was most of a placement
// (docs/benchmarks, §17). The tree is github.com/google/btree's, a
// well-kept ordered set with deletion, which the standard library lacks.
//
// Only the requests that ask nothing of the host have tables: the
// collector's (a snapshot says nothing of a host's CPU and memory), whose
// shapes are a mix's few. A replay's requests each carry their pod's CPU and
// memory, so their shapes seldom come again, and a table made for each
// would cost more than it saves; they are placed by placeFloored and
// placeBounded, which read every node's summary.

// shapeKey is what of a request that asks nothing of the host a row
// depends on: a floor, an Align and the summary's fit without models depend
// on nothing else of it (placement's fragFloor, alignFigures.of,
// summary.fitsResources).
type shapeKey struct{ units, gpus int }

// shapeRow is one node's figures for a shape.
type shapeRow struct {
	floor, align float64
	// gpuFree is the node's best-fit bound (summary.bound), free its free
	// units: what ranks tied answers.
	gpuFree, free int
	state         rowState
}

type rowState uint8

const (
	rowStale  rowState = iota // not read since the node last changed
	rowFits                   // the node may fit the shape but for models; in the tree
	rowCannot                 // the node cannot fit the shape
)

// rowKey is the best answer node index could give: its floor with the
// figures that break ties, ordered as Cluster.before orders answers under
// frag and, with no floor or Align, best-fit; spread's, which prefers more
// free units, are negated (Cluster.keyOf).
type rowKey struct {
	floor, align  float64
	gpuFree, free int
	index         int
}

// less says whether an answer of figures k comes before one of o.
func (k rowKey) less(o rowKey) bool {
	switch {
	case k.floor != o.floor:
		return k.floor < o.floor
	case k.align != o.align:
		return k.align > o.align
	case k.gpuFree != o.gpuFree:
		return k.gpuFree < o.gpuFree
	case k.free != o.free:
		return k.free < o.free
	}
	return k.index < o.index
}

// keyOf is the figures of an answer as a row orders them: under best-fit
// and spread, as Cluster.before, its GPU's and node's free units alone.
func (c *Cluster) keyOf(v Verdict) rowKey {
	k := rowKey{floor: v.Best.Frag, align: v.Best.Align, gpuFree: v.Best.GPUFree, free: v.FreeUnits, index: v.index}
	if c.bounded() {
		k.floor, k.align = 0, 0
	}
	if c.policy == placement.Spread {
		k.gpuFree, k.free = -k.gpuFree, -k.free
	}
	return k
}

func (row shapeRow) key(i int) rowKey {
	return rowKey{floor: row.floor, align: row.align, gpuFree: row.gpuFree, free: row.free, index: i}
}

type shapeTable struct {
	key   shapeKey
	used  uint64 // the placement that last read it: the oldest goes first
	rows  []shapeRow
	order *btree.BTreeG[rowKey]
	// stale lists the rows to read again before the next placement, each
	// at least once (a row may be listed twice; one past the nodes is
	// skipped).
	stale []int
}

// maxShapeTables bounds the shapes kept: a learnt mix has a few, and a
// table of 10,000 nodes is about 800 KB with its tree.
const maxShapeTables = 8

// treeDegree is the B-tree's: nodes of up to 63 keys of 40 bytes.
const treeDegree = 32

// reset empties t for key.
func (t *shapeTable) reset(key shapeKey) {
	t.key, t.rows, t.stale = key, t.rows[:0], t.stale[:0]
	if t.order == nil {
		t.order = btree.NewG(treeDegree, rowKey.less)
	}
	t.order.Clear(true)
}

// markStale takes row i out of t's order, to be read again.
func (t *shapeTable) markStale(i int) {
	if i >= len(t.rows) {
		return
	}
	row := &t.rows[i]
	switch row.state {
	case rowStale:
		return
	case rowFits:
		t.order.Delete(row.key(i))
	}
	row.state = rowStale
	t.stale = append(t.stale, i)
}

// shapeTable is the table of r's shape, sized to the cluster, made anew in
// place of the least recently read one when there is none; nil for a
// request that asks something of the host.
func (c *Cluster) shapeTable(r *Request) *shapeTable {
	if r.HostCPUMilli != 0 || r.HostMemoryMiB != 0 {
		return nil
	}
	c.placements++
	key := shapeKey{units: r.Units, gpus: r.GPUs}
	var t *shapeTable
	for _, k := range c.tables {
		if k.key == key {
			t = k
			break
		}
	}
	if t == nil {
		if len(c.tables) < maxShapeTables {
			t = &shapeTable{}
			c.tables = append(c.tables, t)
		} else {
			t = c.tables[0]
			for _, k := range c.tables[1:] {
				if k.used < t.used {
					t = k
				}
			}
		}
		t.reset(key)
	}
	t.used = c.placements
	// Rows past the nodes were marked stale when their nodes left
	// (Remove), and so are out of the tree.
	t.rows = t.rows[:min(len(t.rows), len(c.nodes))]
	for len(t.rows) < len(c.nodes) {
		t.stale = append(t.stale, len(t.rows))
		t.rows = append(t.rows, shapeRow{})
	}
	c.readStale(t, r)
	return t
}

// readStale reads t's stale rows from their nodes and puts those that may
// fit in the tree.
func (c *Cluster) readStale(t *shapeTable, r *Request) {
	for _, i := range t.stale {
		if i >= len(t.rows) || t.rows[i].state != rowStale {
			continue
		}
		row := &t.rows[i]
		*row = c.figures(i, r)
		if row.state == rowFits {
			t.order.ReplaceOrInsert(row.key(i))
		}
	}
	t.stale = t.stale[:0]
}

// placeTabled asks the nodes of t's tree from the best, the nodes whose
// models r does not accept passed over, until the next is beaten by the
// answers kept.
func (c *Cluster) placeTabled(t *shapeTable, r *Request, limit int, a *Answer) {
	t.order.Ascend(func(k rowKey) bool {
		if len(a.Ranked) == limit && !k.less(c.keyOf(a.Ranked[limit-1])) {
			return false
		}
		n := c.nodes[k.index]
		if len(r.Models) > 0 && !n.sum.fitsModels(r) {
			return true
		}
		a.Considered++
		if v := c.ask(n, r); v.kept {
			a.Ranked = c.insert(a.Ranked, Verdict{Node: n.name, Kept: true, Choice: v.choice, Best: v.best, FreeUnits: n.sum.free, index: k.index}, limit)
		}
		return true
	})
}

// figures is node i's row for r, read from the node.
func (c *Cluster) figures(i int, r *Request) shapeRow {
	n := c.nodes[i]
	if !n.sum.fitsResources(r) {
		return shapeRow{state: rowCannot}
	}
	if c.bounded() {
		// The node's summary bounds its answer (bound.go).
		row := shapeRow{gpuFree: n.sum.bound(c.policy, r), free: n.sum.free, state: rowFits}
		if c.policy == placement.Spread {
			row.gpuFree, row.free = -row.gpuFree, -row.free
		}
		return row
	}
	// The floor first: it fills the memo that Align reads.
	floor := c.engine.FragFloor(n.model, r.Request, &n.memo)
	row := c.tiesOf(n, r)
	row.floor, row.state = floor, rowFits
	return row
}

// tiesOf is n's figures that rank its answers to r among those of its
// floor; its floor and state are left unset.
func (c *Cluster) tiesOf(n *node, r *Request) shapeRow {
	return shapeRow{
		align:   c.engine.Align(n.model, r.Request, &n.memo),
		gpuFree: n.sum.bound(placement.BestFit, r), free: n.sum.free,
	}
}

// staleRows marks node i's rows stale in every table: it changed.
func (c *Cluster) staleRows(i int) {
	for _, t := range c.tables {
		t.markStale(i)
	}
}
