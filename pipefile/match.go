package pipefile

import (
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
