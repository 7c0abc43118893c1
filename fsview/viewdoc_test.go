package fsview

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The layout block of docs/view.md is the users' reference for the view
// (docs/design.md §9, a contract); this test holds it to rootNames and
// gpuNames, the layout tree.go serves.
func TestViewDocMatchesLayout(t *testing.T) {
	b, err := os.ReadFile("../docs/view.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "```\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/view.md: no layout block")
	}
	// The root's files are the block's first line; its folders are the
	// first components of the paths below.
	first, rest, _ := strings.Cut(block, "\n")
	var root []string
	root = append(root, strings.Fields(first)...)
	for line := range strings.Lines(rest) {
		if dir, _, ok := strings.Cut(strings.TrimSpace(line), "/"); ok && dir != "" && !slices.Contains(root, dir) {
			root = append(root, dir)
		}
	}
	var want []string
	for _, d := range rootNames {
		want = append(want, d.name)
	}
	if !slices.Equal(root, want) {
		t.Errorf("docs/view.md shows the root as %q; the view has %q", root, want)
	}
	m := regexp.MustCompile(`gpus/<index>/\{([^}]*)\}`).FindStringSubmatch(block)
	if m == nil {
		t.Fatal("docs/view.md: no gpus/<index>/{...} in the layout block")
	}
	var gpu, wantGPU []string
	for _, f := range strings.Split(m[1], ",") {
		gpu = append(gpu, strings.TrimSpace(f))
	}
	for _, d := range gpuNames {
		wantGPU = append(wantGPU, d.name)
	}
	if !slices.Equal(gpu, wantGPU) {
		t.Errorf("docs/view.md shows gpus/<index>/ as %q; the view has %q", gpu, wantGPU)
	}
	for _, s := range []string{"gpus/<uuid> -> <index>", "leases/<id>", "reservations/<name>"} {
		if !strings.Contains(block, s) {
			t.Errorf("docs/view.md's layout block lacks %s", s)
		}
	}
}
