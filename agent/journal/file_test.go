package journal

import (
	"os"
	"path/filepath"
	"testing"
)

// A daemon that dies in a rewrite leaves the new journal's temporary file
// beside the journal. Nothing else would ever remove it, and in a run dir of
// a few megabytes it holds room the journal needs: the next daemon's first
// rewrite removes it, and nothing else.
func TestFirstRewriteRemovesWhatACrashedRewriteLeft(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "leases.journal")
	left := filepath.Join(dir, ".leases.journal.2718281828")
	keep := []string{
		filepath.Join(dir, ".leases.journal.x1"),
		filepath.Join(dir, ".layout.json.31415"),
		filepath.Join(dir, "leases.journal.1"),
	}
	for _, p := range append([]string{left}, keep...) {
		if err := os.WriteFile(p, []byte("part of a journal"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	j := NewFile(path)
	defer j.Close()
	if err := j.Rewrite(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Fatalf("temporary file of a crashed rewrite still there: %v", err)
	}
	for _, p := range keep {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
}
