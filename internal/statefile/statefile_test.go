package statefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	for _, body := range []string{"one", "two"} {
		if err := Write(path, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != body {
			t.Fatalf("%q, %v", b, err)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
	// A write that cannot be made leaves the old file as it was.
	if err := Write(filepath.Join(dir, "missing", "f.json"), []byte("x"), 0o600); err == nil {
		t.Fatal("a write into a missing folder succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("old file changed: %q", b)
	}
}

func TestSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "reservations.json")
	for i := range 2 {
		if err := os.WriteFile(path, []byte("damaged"), 0o600); err != nil {
			t.Fatal(err)
		}
		aside, err := SetAside(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(filepath.Base(aside), "reservations.json.damaged") {
			t.Fatalf("set aside as %s", aside)
		}
		if b, err := os.ReadFile(aside); err != nil || string(b) != "damaged" {
			t.Fatalf("round %d: set-aside file %q, %v", i, b, err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("two damaged files must both be kept: %v", ents)
	}
}
