package reserve

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleRecords() []Record {
	t0 := time.Date(2026, 11, 22, 17, 0, 0, 0, time.UTC)
	return []Record{
		{Name: "wf1", UID: 1000, GID: 1000, Created: t0, Needs: []int{2, 6, 6, 8}, Priority: 10,
			Share:  []Member{{Name: "bob", ID: 1001, Weight: 1}, {Name: "group:ml", Group: true, ID: 50, Weight: 2}},
			Active: true, Stage: 1, Reclaimed: 4,
			Units:      []GPUUnits{{UUID: "GPU-a", Units: []int{0, 1, 2, 3}}, {UUID: "GPU-b", Units: []int{8, 9, 10, 11}}},
			Reclaiming: []Reclaiming{{Lease: "l-0123456789abcdef", KillAt: t0.Add(10 * time.Second)}}},
		{Name: "wf2", UID: 1002, GID: 1002, Created: t0.Add(time.Minute), Needs: []int{4}},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	want := sampleRecords()
	if err := Save(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil || len(got.Skipped) != 0 {
		t.Fatalf("load: %v, skipped %v", err, got.Skipped)
	}
	if !reflect.DeepEqual(got.Records, want) {
		t.Fatalf("got %+v\nwant %+v", got.Records, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("file mode %v, %v; want 0600: it names users", fi.Mode(), err)
	}
	// Nothing but the file is left in the folder.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("folder holds %v", ents)
	}
	// Saving none keeps a file that says so.
	if err := Save(path, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(path); err != nil || len(got.Records) != 0 {
		t.Fatalf("after saving none: %+v, %v", got, err)
	}
}

func TestLoadMissingFileHoldsNone(t *testing.T) {
	got, err := Load(filepath.Join(t.TempDir(), FileName))
	if err != nil || len(got.Records) != 0 {
		t.Fatalf("%+v, %v", got, err)
	}
}

// TestSaveFailureKeepsTheOldFile: a write that cannot be made (here: the
// folder is read-only, as a full disk refuses the new file) leaves the old
// file whole.
func TestSaveFailureKeepsTheOldFile(t *testing.T) {
	if os.Getuid() == 0 {
		// Root writes into read-only folders; a full file system is
		// tried end to end (test/reserve_test.go).
		t.Skip("root ignores folder permissions; the full-disk case runs end to end")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := Save(path, sampleRecords()[:1]); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o500)
	defer os.Chmod(dir, 0o700)
	if err := Save(path, sampleRecords()); err == nil {
		t.Fatal("save into a read-only folder succeeded")
	}
	got, err := Load(path)
	if err != nil || len(got.Records) != 1 {
		t.Fatalf("old file: %+v, %v", got, err)
	}
}

func TestLoadDamaged(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"not JSON", "{\"schema\":\"gpulet.res"},
		{"other schema", `{"schema":"gpulet.reservations/v9","reservations":[]}`},
		{"unknown field", `{"schema":"gpulet.reservations/v1","reservations":[],"x":1}`},
		{"trailing data", `{"schema":"gpulet.reservations/v1","reservations":[]} x`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse([]byte(tc.body)); !errors.Is(err, ErrDamaged) {
				t.Fatalf("err %v, want ErrDamaged", err)
			}
		})
	}
}

// TestLoadSkipsBadRecords: one bad record costs that record, named; the
// others count.
func TestLoadSkipsBadRecords(t *testing.T) {
	body := `{"schema":"gpulet.reservations/v1","reservations":[
	 {"name":"ok","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":false,"stage":0,"reclaimed":0},
	 {"name":"../etc","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":false,"stage":0,"reclaimed":0},
	 {"name":"stage","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":true,"stage":3,"reclaimed":0},
	 {"name":"units","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":true,"stage":0,"reclaimed":0,"units":[{"uuid":"G","units":[3,1]}]},
	 {"name":"pend","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":false,"stage":0,"reclaimed":0,"units":[{"uuid":"G","units":[1]}]},
	 {"name":"zero","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[0],"priority":0,"active":false,"stage":0,"reclaimed":0},
	 {"name":"ok","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":false,"stage":0,"reclaimed":0},
	 {"name":"extra","uid":1,"gid":1,"created":"2026-01-01T00:00:00Z","needs":[2],"priority":0,"active":false,"stage":0,"reclaimed":0,"bogus":1},
	 7
	]}`
	got, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 1 || got.Records[0].Name != "ok" {
		t.Fatalf("kept %+v", got.Records)
	}
	want := []string{"record 1 (no valid name)", `record 2 ("stage"): stage 3 of 1`, `record 3 ("units")`, `record 4 ("pend"): a pending reservation with units`,
		`record 5 ("zero")`, `record 6 ("ok"): a second reservation`, `record 7 ("extra")`, "record 8"}
	if len(got.Skipped) != len(want) {
		t.Fatalf("skipped %q", got.Skipped)
	}
	for i, w := range want {
		if !strings.HasPrefix(got.Skipped[i], w) {
			t.Errorf("skipped[%d] = %q, want it to start %q", i, got.Skipped[i], w)
		}
	}
}

func TestLoadDoesNotFollowSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere.json")
	if err := Save(target, sampleRecords()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("loaded through a symlink")
	}
	// Save replaces the link itself, never what it points at.
	if err := Save(path, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(target); err != nil || len(got.Records) != 2 {
		t.Fatalf("the link's target changed: %+v, %v", got, err)
	}
}

func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, FileName)
	if err := Save(path, sampleRecords()); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	f.Add(b)
	f.Add([]byte(`{"schema":"gpulet.reservations/v1","reservations":[]}`))
	f.Add([]byte(`{"schema":"gpulet.reservations/v1","reservations":[{"name":"a","needs":[1],"stage":0}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("error not ErrDamaged: %v", err)
			}
			return
		}
		for _, r := range got.Records {
			if err := r.check(); err != nil {
				t.Fatalf("kept a record that fails its checks: %v", err)
			}
		}
		// What was kept saves and loads back the same.
		p := filepath.Join(t.TempDir(), FileName)
		if err := Save(p, got.Records); err != nil {
			t.Fatal(err)
		}
		again, err := Load(p)
		if err != nil || len(again.Skipped) != 0 || len(again.Records) != len(got.Records) {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}
