package api

import (
	"fmt"
	"strconv"
	"strings"
)

// GPUIndex reports whether a request's gpu names a GPU by index, and which;
// otherwise it names one by UUID.
func GPUIndex(sel string) (int, bool) {
	n, err := strconv.Atoi(sel)
	return n, err == nil
}

// MatchGPU says whether a request's gpu (an index, or a UUID in any case)
// names the GPU with this index and UUID. An empty gpu matches every GPU.
func MatchGPU(sel string, index int, uuid string) bool {
	if sel == "" {
		return true
	}
	if n, ok := GPUIndex(sel); ok {
		return n == index
	}
	return strings.EqualFold(sel, uuid)
}

// MatchType says whether a request's type matches a GPU's name: a
// case-insensitive part of it ("T4", "a100", "H100 80GB"). An empty type
// matches every GPU.
func MatchType(typ, name string) bool {
	return typ == "" || strings.Contains(strings.ToLower(name), strings.ToLower(typ))
}

// FindGPU returns the position of the GPU a request's gpu names among n GPUs,
// at(i) giving the index and UUID of the one at position i. The error says
// what is wrong with gpu, ready to follow "gpu: ".
func FindGPU(sel string, n int, at func(i int) (index int, uuid string)) (int, error) {
	for i := 0; i < n; i++ {
		if index, uuid := at(i); MatchGPU(sel, index, uuid) {
			return i, nil
		}
	}
	if idx, ok := GPUIndex(sel); ok {
		return 0, fmt.Errorf("no GPU with index %d (this node has %d)", idx, n)
	}
	return 0, fmt.Errorf("no GPU with UUID %q on this node", sel)
}
