package procfs

import (
	"encoding/binary"
	"os"
	"testing"
)

func TestCountDirents(t *testing.T) {
	rec := func(name string) []byte {
		reclen := (19 + len(name) + 1 + 7) &^ 7
		b := make([]byte, reclen)
		binary.NativeEndian.PutUint16(b[16:], uint16(reclen))
		copy(b[19:], name)
		return b
	}
	two := append(rec("."), rec("10")...)
	if n, err := countDirents(two); n != 2 || err != nil {
		t.Fatalf("countDirents = %d, %v; want 2", n, err)
	}
	for name, b := range map[string][]byte{"truncated": two[:30], "zero length": make([]byte, 24), "too long": append(rec("1")[:16], 0xff, 0xff, 0, 0, 0, 0, 0, 0)} {
		if _, err := countDirents(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzCountDirents(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 24))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 24, 0, 4, '.', 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := countDirents(b)
		if err == nil && n > len(b)/19 {
			t.Fatalf("%d records in %d bytes", n, len(b))
		}
	})
}

// OpenDescriptors sees a descriptor opened and closed.
func TestOpenDescriptors(t *testing.T) {
	before, err := OpenDescriptors()
	if err != nil || before < 3 {
		t.Fatalf("%d open, %v", before, err)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	if now, err := OpenDescriptors(); err != nil || now != before+1 {
		t.Fatalf("%d open with one more, %v; want %d", now, err, before+1)
	}
	f.Close()
}
