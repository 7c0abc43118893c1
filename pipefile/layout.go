package pipefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// LayoutFile is the name of the layout under <run-dir>/units.
const LayoutFile = "layout.json"

// LayoutSchema names the layout format.
const LayoutSchema = "gpulet.layout/v1"

// MaxLayout bounds layout.json: the largest node's layout is far smaller.
const MaxLayout = 16 << 20

// Layout is layout.json: what an offline claimer reads to know which names it
// may take and the environment its process runs with.
type Layout struct {
	Schema string      `json:"schema"`
	GPUs   []LayoutGPU `json:"gpus"`
}

// LayoutGPU is one GPU of layout.json.
type LayoutGPU struct {
	Index      int              `json:"index"`
	UUID       string           `json:"uuid"`
	Name       string           `json:"name"`
	UnitsTotal int              `json:"units_total"`
	Instances  []LayoutInstance `json:"instances"`
}

// LayoutInstance is one MPS instance of layout.json: the units it owns and
// the environment a process holding one of them runs with.
type LayoutInstance struct {
	Instance int               `json:"instance"`
	Units    []int             `json:"units"`
	Env      map[string]string `json:"env"`
}

// ReadLayout reads and checks <runDir>/units/layout.json.
func ReadLayout(runDir string) (*Layout, error) {
	path := filepath.Join(UnitsRoot(runDir), LayoutFile)
	b, err := readCapped(path, MaxLayout)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no pipe-file ledger at %s: gpuletd has never run with this run dir (start it once, or point --run-dir or %s at its run dir)", path, EnvRunDir)
	}
	if err != nil {
		return nil, err
	}
	lay, err := DecodeLayout(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return lay, nil
}

// readCapped reads the file at path, refusing one larger than most bytes:
// what gpuletd writes for claimers is small, and a claimer must not read
// without bound whatever is there.
func readCapped(path string, most int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(most)+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > most {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, most)
	}
	return b, nil
}

// DecodeLayout parses layout.json and checks what a claim relies on: the known
// schema, UUIDs that are one path element (they become folder names), unit
// indices inside units_total and owned by one instance only.
func DecodeLayout(b []byte) (*Layout, error) {
	var lay Layout
	if err := json.Unmarshal(b, &lay); err != nil {
		return nil, fmt.Errorf("malformed layout: %w", err)
	}
	if lay.Schema != LayoutSchema {
		return nil, fmt.Errorf("layout schema %q, want %q", lay.Schema, LayoutSchema)
	}
	for _, g := range lay.GPUs {
		if g.UUID == "" || strings.ContainsAny(g.UUID, "/\x00") || g.UUID == "." || g.UUID == ".." {
			return nil, fmt.Errorf("layout: GPU %d has a bad UUID %q", g.Index, g.UUID)
		}
		if g.UnitsTotal < 1 || g.UnitsTotal > MaxUnits {
			return nil, fmt.Errorf("layout: GPU %d has %d units, want 1 to %d", g.Index, g.UnitsTotal, MaxUnits)
		}
		owned := map[int]bool{}
		for _, in := range g.Instances {
			if in.Instance < 0 {
				return nil, fmt.Errorf("layout: GPU %d has instance %d", g.Index, in.Instance)
			}
			for _, u := range in.Units {
				if u < 0 || u >= g.UnitsTotal {
					return nil, fmt.Errorf("layout: GPU %d instance %d has unit %d outside 0..%d", g.Index, in.Instance, u, g.UnitsTotal-1)
				}
				if owned[u] {
					return nil, fmt.Errorf("layout: GPU %d has unit %d in two instances", g.Index, u)
				}
				owned[u] = true
			}
		}
	}
	return &lay, nil
}
