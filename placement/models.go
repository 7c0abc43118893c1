package placement

import (
	"strings"

	"github.com/gpulet/gpulet/api"
)

// Accepts says whether sh's requests may take a GPU named name: its Type
// is part of the name, and so is one of its Models, when it lists any.
func (sh *Shape) Accepts(name string) bool {
	if !api.MatchType(sh.Type, name) {
		return false
	}
	if sh.Models == "" {
		return true
	}
	for m := range strings.SplitSeq(sh.Models, "|") {
		if api.MatchType(m, name) {
			return true
		}
	}
	return false
}

// Restricted says whether sh's requests accept only some GPU models.
func (sh *Shape) Restricted() bool { return sh.Type != "" || sh.Models != "" }

// accepting is, for each shape of m, whether it accepts a GPU named name,
// read once per name for the life of m: a node's scorer, made again each
// time the node changes, would otherwise compare each shape's models with
// each GPU's name (case-insensitively, which allocates) again.
func (m *Mix) accepting(name string) []bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if row, ok := m.accepts[name]; ok {
		return row
	}
	row := make([]bool, len(m.Shapes))
	for i := range m.Shapes {
		row[i] = m.Shapes[i].Accepts(name)
	}
	if m.accepts == nil {
		m.accepts = map[string][]bool{}
	}
	m.accepts[name] = row
	return row
}

// openRow is the row of every GPU when no shape of m is restricted (nil
// when one is): a cluster makes a scorer for each of its nodes under each
// new mix, and most mixes restrict nothing, so it needs no name looked up.
func (m *Mix) openRow() []bool {
	m.openOnce.Do(func() {
		for i := range m.Shapes {
			if m.Shapes[i].Restricted() {
				return
			}
		}
		m.open = make([]bool, len(m.Shapes))
		for i := range m.open {
			m.open[i] = true
		}
	})
	return m.open
}
