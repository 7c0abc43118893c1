package placement

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/api"
)

// docs/placement.md prints the simulated models' figures and a worked example
// of the score policy. These tests read its tables and check every figure in
// them against the code, so that the page cannot drift from what gpuletd does.

const placementDoc = "../docs/placement.md"

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(placementDoc)
	if err != nil {
		t.Fatalf("the placement doc: %v", err)
	}
	return string(b)
}

// docTable is one table of the doc: the text of its marker comment after
// "table:", its rows (header and separator left out) and the text that
// follows it up to the next marker.
type docTable struct {
	marker string
	rows   [][]string
	after  string
}

var markerRE = regexp.MustCompile(`(?m)^<!-- table:(.*?) -->$`)

// docTables finds every table that follows a "<!-- table:NAME -->" line.
func docTables(t *testing.T, doc string) []docTable {
	t.Helper()
	var out []docTable
	locs := markerRE.FindAllStringSubmatchIndex(doc, -1)
	for i, loc := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		dt := docTable{marker: doc[loc[2]:loc[3]]}
		lines := strings.Split(doc[loc[1]:end], "\n")
		n := 1 // the marker's own line ends at loc[1]
		for n < len(lines) && strings.HasPrefix(lines[n], "|") {
			n++
		}
		if n < 4 {
			t.Fatalf("marker %q is not followed by a table with a row", dt.marker)
		}
		for _, line := range lines[3:n] {
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for j := range cells {
				cells[j] = strings.TrimSpace(cells[j])
			}
			dt.rows = append(dt.rows, cells)
		}
		dt.after = strings.Join(lines[n:], "\n")
		out = append(out, dt)
	}
	return out
}

func findTable(t *testing.T, tables []docTable, marker string, columns int) docTable {
	t.Helper()
	for _, dt := range tables {
		if dt.marker == marker {
			for _, r := range dt.rows {
				if len(r) != columns {
					t.Fatalf("table %s: row %q has %d cells, want %d", marker, r, len(r), columns)
				}
			}
			return dt
		}
	}
	t.Fatalf("the doc has no table %q", marker)
	return docTable{}
}

var numberRE = regexp.MustCompile(`-?[0-9]+(\.[0-9]+)?`)

// numbers reads every number in a cell: "(0.2500, 0.9115)" is two.
func numbers(t *testing.T, cell string) []float64 {
	t.Helper()
	var out []float64
	for _, s := range numberRE.FindAllString(cell, -1) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("cell %q: %v", cell, err)
		}
		out = append(out, v)
	}
	return out
}

func number(t *testing.T, cell string) float64 {
	t.Helper()
	n := numbers(t, cell)
	if len(n) != 1 {
		t.Fatalf("cell %q: want one number", cell)
	}
	return n[0]
}

// printed checks that the doc's figure is v as printed to its decimals.
func printed(t *testing.T, what, cell string, v float64) {
	t.Helper()
	decimals := 0
	if _, frac, ok := strings.Cut(numberRE.FindString(cell), "."); ok {
		decimals = len(frac)
	}
	if want := strconv.FormatFloat(v, 'f', decimals, 64); numberRE.FindString(cell) != want {
		t.Errorf("%s: the doc says %s, the code %s (%v)", what, cell, want, v)
	}
}

func simModel(t *testing.T, key string) (inventory.Model, inventory.Device) {
	t.Helper()
	models, err := inventory.ParseSimSpec(key)
	if err != nil || len(models) != 1 {
		t.Fatalf("model %q: %v", key, err)
	}
	return models[0], inventory.NewSim("doc", models).Devices()[0]
}

// The model table is the simulated backend's, and its derived bandwidth is the
// datasheet's within 0.3%.
func TestDocModelTable(t *testing.T) {
	dt := findTable(t, docTables(t, readDoc(t)), "models", 9)
	if len(dt.rows) != len(inventory.Models) {
		t.Errorf("the doc lists %d models, the simulated backend has %d", len(dt.rows), len(inventory.Models))
	}
	for _, r := range dt.rows {
		m, d := simModel(t, r[0])
		if m.Key != r[0] || m.Name != r[1] || d.ComputeCapability() != r[2] {
			t.Errorf("model %s: the doc says %q %s, the code %q %s", r[0], r[1], r[2], m.Name, d.ComputeCapability())
		}
		for _, f := range []struct {
			what string
			cell string
			v    float64
		}{
			{"memory", r[3], float64(m.MemoryTotalMiB)},
			{"bus width", r[4], float64(m.MemoryBusWidthBit)},
			{"memory clock", r[5], float64(m.MemoryClockMHz)},
			{"bandwidth", r[6], float64(d.MemoryBandwidthGBps())},
			{"SM clock", r[8], float64(m.MaxSMClockMHz)},
		} {
			printed(t, m.Key+" "+f.what, f.cell, f.v)
		}
		if sheet := number(t, r[7]); math.Abs(float64(d.MemoryBandwidthGBps())-sheet) > 0.003*sheet {
			t.Errorf("model %s: derived bandwidth %d GB/s is more than 0.3%% from the datasheet's %v", m.Key, d.MemoryBandwidthGBps(), sheet)
		}
	}
}

var goesToRE = regexp.MustCompile(`The lease goes to \*\*GPU ([0-9]+)\*\*`)

// The worked example: the node it describes, placed as the doc says, with
// every figure it prints.
func TestDocWorkedExample(t *testing.T) {
	tables := docTables(t, readDoc(t))
	nodeTable := findTable(t, tables, "example-node", 6)
	n := &Node{ClientsPerInstance: 16}
	var devs []inventory.Device
	const units = 16 // the default unit model, which the doc names
	for _, r := range nodeTable.rows {
		m, d := simModel(t, r[1])
		taken, memUsed := int(number(t, r[2])), uint64(number(t, r[3]))
		printed(t, "GPU "+r[0]+" units free", r[4], float64(units-taken))
		printed(t, "GPU "+r[0]+" memory free", r[5], float64(m.MemoryTotalMiB-memUsed))
		in := Instance{Size: units, Clients: taken}
		for u := taken; u < units; u++ {
			in.FreeUnits = append(in.FreeUnits, u)
		}
		gi := len(n.GPUs)
		if r[0] != strconv.Itoa(gi) {
			t.Fatalf("example node: row %q out of order", r)
		}
		n.GPUs = append(n.GPUs, GPU{Index: gi, UUID: fmt.Sprintf("GPU-%d", gi), Name: m.Name, Units: units, Free: units - taken,
			MemoryTotalMiB: m.MemoryTotalMiB, MemoryFreeMiB: m.MemoryTotalMiB - memUsed, Instances: []Instance{in},
			Card: Card{CC: d.CC(), MemoryBandwidthGBps: d.MemoryBandwidthGBps(), SMClockMHz: d.MaxSMClockMHz}})
		devs = append(devs, d)
	}

	cards := findTable(t, tables, "example-cards", 8)
	d, err := New(Score).Explain(n, Request{Units: 1})
	if err != nil || len(cards.rows) != len(n.GPUs) {
		t.Fatalf("cards: %v, %d rows for %d GPUs", err, len(cards.rows), len(n.GPUs))
	}
	for i, r := range cards.rows {
		s, dev := d.Verdicts[i].Score, devs[i]
		what := "GPU " + r[0]
		if r[1] != dev.ComputeCapability() {
			t.Errorf("%s cc: the doc says %s, the code %s", what, r[1], dev.ComputeCapability())
		}
		printed(t, what+" bandwidth", r[2], float64(dev.MemoryBandwidthGBps()))
		printed(t, what+" SM clock", r[3], float64(dev.MaxSMClockMHz))
		printed(t, what+" cc′", r[4], s.CC)
		printed(t, what+" bandwidth′", r[5], s.Bandwidth)
		printed(t, what+" clock′", r[6], s.Clock)
		printed(t, what+" S_card", r[7], s.Card)
	}

	requests := 0
	for _, dt := range tables {
		body, ok := strings.CutPrefix(dt.marker, "example-request ")
		if !ok {
			continue
		}
		requests++
		t.Run(body, func(t *testing.T) {
			var lr api.LeaseRequest
			dec := json.NewDecoder(strings.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&lr); err != nil {
				t.Fatalf("request %s: %v", body, err)
			}
			r := Request{Units: lr.Units, MemoryMiB: lr.MemoryMiB}
			if lr.MinCC != "" {
				if r.MinCC, err = api.ParseComputeCapability(lr.MinCC); err != nil {
					t.Fatal(err)
				}
			}
			d, err := New(Score).Explain(n, r)
			if err != nil {
				t.Fatal(err)
			}
			rows := findTable(t, tables, dt.marker, 9).rows
			kept := 0
			for _, v := range d.Verdicts {
				if !v.Kept {
					// A GPU left out is named with the engine's own words.
					if !strings.Contains(readDoc(t), `("`+v.Why+`")`) {
						t.Errorf("GPU %d is left out (%s), and the doc does not say so", v.GPU, v.Why)
					}
					continue
				}
				if kept >= len(rows) {
					t.Fatalf("GPU %d is kept and has no row", v.GPU)
				}
				row := rows[kept]
				kept++
				what := "GPU " + row[0]
				if row[0] != strconv.Itoa(v.GPU) {
					t.Fatalf("row %q, want GPU %d", row, v.GPU)
				}
				free, asked := vectors(&n.GPUs[v.GPU], r)
				fv, av := numbers(t, row[1]), numbers(t, row[2])
				if len(fv) != 2 || len(av) != 2 {
					t.Fatalf("%s: vectors %q %q", what, row[1], row[2])
				}
				for k := 0; k < 2; k++ {
					printed(t, what+" free", strconv.FormatFloat(fv[k], 'f', 4, 64), free[k])
					printed(t, what+" asked", strconv.FormatFloat(av[k], 'f', 4, 64), asked[k])
				}
				printed(t, what+" free·asked", row[3], free[0]*asked[0]+free[1]*asked[1])
				printed(t, what+" ‖free‖", row[4], math.Hypot(free[0], free[1]))
				printed(t, what+" ‖asked‖", row[5], math.Hypot(asked[0], asked[1]))
				printed(t, what+" S_similarity", row[6], v.Score.Similarity)
				printed(t, what+" S_card", row[7], v.Score.Card)
				printed(t, what+" score", row[8], v.Score.Total)
			}
			if kept != len(rows) {
				t.Errorf("%d GPUs kept, the doc has %d rows", kept, len(rows))
			}
			m := goesToRE.FindStringSubmatch(dt.after)
			if m == nil {
				t.Fatalf("no \"The lease goes to **GPU N**\" after the table")
			}
			if m[1] != strconv.Itoa(d.Choice.GPU) {
				t.Errorf("the doc says the lease goes to GPU %s, the engine chose GPU %d", m[1], d.Choice.GPU)
			}
		})
	}
	if requests == 0 {
		t.Fatal("the doc has no example request")
	}
}
