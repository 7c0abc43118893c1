package cluster

import "github.com/gpulet/gpulet/placement"

// A frag placement reads every node's floor for the request, and, for the
// nodes that tie at the best floor, the figures that break ties. Read from
// each node's memo, that is a walk over 10,000 nodes' memories in as many
// places, which cost most of a placement. A shape table keeps those figures
// for one shape of request in one array in the cluster's order, a row a
// node, so a placement reads them in one sweep; a row is read again from
// its node only when the node changed since.
//
// Only the requests that ask nothing of the host have tables: the
// collector's (a snapshot says nothing of a host's CPU and memory), whose
// shapes are a mix's few. A replay's requests each carry their pod's CPU and
// memory, so their shapes seldom come again, and a table made for each
// would cost more than it saves.

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
	rowFits                   // the node may fit the shape but for models
	rowCannot                 // the node cannot fit the shape
)

type shapeTable struct {
	key  shapeKey
	used uint64 // the placement that last read it: the oldest goes first
	rows []shapeRow
}

// maxShapeTables bounds the shapes kept: a learnt mix has a few, and a
// table of 10,000 nodes is 400 KB.
const maxShapeTables = 8

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
		t.key, t.rows = key, t.rows[:0]
	}
	t.used = c.placements
	for len(t.rows) < len(c.nodes) {
		t.rows = append(t.rows, shapeRow{})
	}
	t.rows = t.rows[:len(c.nodes)]
	return t
}

// floorOf is node i's floor for r and whether it may fit r at all, from
// t's row or, with no table, the node. A stale row is read anew here, so
// that tieFigures, later in the placement, finds every row it reads fresh.
func (c *Cluster) floorOf(t *shapeTable, i int, r *Request) (float64, bool) {
	n := c.nodes[i]
	if t == nil {
		if !n.sum.mayFit(r) {
			return 0, false
		}
		return c.engine.FragFloor(n.model, r.Request, &n.memo), true
	}
	row := &t.rows[i]
	if row.state == rowStale {
		*row = c.figures(i, r)
	}
	return row.floor, row.state == rowFits && (len(r.Models) == 0 || n.sum.fitsModels(r))
}

// tieFigures is what ranks node i's best answer to r among those of its
// floor: t's row, or, with no table, the node's figures.
func (c *Cluster) tieFigures(t *shapeTable, i int, r *Request) shapeRow {
	if t == nil {
		return c.tiesOf(c.nodes[i], r)
	}
	return t.rows[i]
}

// figures is node i's row for r, read from the node.
func (c *Cluster) figures(i int, r *Request) shapeRow {
	n := c.nodes[i]
	if !n.sum.fitsResources(r) {
		return shapeRow{state: rowCannot}
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
		if i < len(t.rows) {
			t.rows[i].state = rowStale
		}
	}
}
