package filestamp

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func stampOf(t *testing.T, path string) Stamp {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return Of(fi)
}

// A rewrite of the same length whose modification time is set back, and an
// atomic replace, each change the stamp; a stat of an unchanged file does not.
func TestStampChangesWithEveryRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("old-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	then := time.Unix(1_700_000_000, 0)
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	first := stampOf(t, path)
	if stampOf(t, path) != first {
		t.Fatal("two stats of an unchanged file differ")
	}

	// cp -p: the same length, the old modification time put back.
	// The change time ticks with the kernel's clock (a jiffy, 10 ms at most).
	time.Sleep(25 * time.Millisecond)
	if err := os.WriteFile(path, []byte("new-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	second := stampOf(t, path)
	if second == first {
		t.Fatal("a same-length rewrite with its modification time set back kept the stamp")
	}

	// An atomic replace keeps nothing of the old file but its name.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("newer-tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, then, then); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if stampOf(t, path) == second {
		t.Fatal("a file renamed over the old one kept its stamp")
	}
}
