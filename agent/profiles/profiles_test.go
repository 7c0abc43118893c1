package profiles

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const a100, t4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"

func TestSeedsOrderModels(t *testing.T) {
	s, err := Open(t.TempDir(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.Seed(map[string]map[string]time.Duration{"resnet50": {a100: 95 * time.Second, t4: 410 * time.Second}})
	if got := s.Prefer(1000, "resnet50"); !slices.Equal(got, []string{a100, t4}) {
		t.Fatalf("Prefer = %v", got)
	}
	if got := s.Prefer(1000, "unknown"); got != nil {
		t.Fatalf("Prefer(unknown) = %v, want nil", got)
	}
}

// TestRecordMovesTheMean: each run moves the mean by Weight of its
// difference, starting from the seed; the order of models follows.
func TestRecordMovesTheMean(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.Seed(map[string]map[string]time.Duration{"bert": {a100: 100 * time.Second, t4: 120 * time.Second}})
	// 100s → 0.7·100 + 0.3·200 = 130s, then 0.7·130 + 0.3·200 = 151s: the
	// A100 falls behind the T4.
	for _, want := range []time.Duration{130 * time.Second, 151 * time.Second} {
		if err := s.Record("bert", a100, 1000, 200*time.Second); err != nil {
			t.Fatal(err)
		}
		if e := s.Table().Learned[1000]["bert"][a100]; e.Mean != want {
			t.Fatalf("mean %s, want %s", e.Mean, want)
		}
	}
	if got := s.Prefer(1000, "bert"); !slices.Equal(got, []string{t4, a100}) {
		t.Fatalf("Prefer = %v", got)
	}
	// Another user's placements follow the config's figures, not uid
	// 1000's runs.
	if got := s.Prefer(1001, "bert"); !slices.Equal(got, []string{a100, t4}) {
		t.Fatalf("uid 1001's Prefer = %v", got)
	}
	// A task the config does not know starts at its first run.
	if err := s.Record("new", t4, 1000, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if e := s.Table().Learned[1000]["new"][t4]; e.Mean != 10*time.Second || e.Runs != 1 {
		t.Fatalf("new task entry %+v", e)
	}
	// The measured runs survive a restart, and the seeds come back from the
	// config.
	s2, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if e := s2.Table().Learned[1000]["bert"][a100]; e.Mean != 151*time.Second || e.Runs != 2 {
		t.Fatalf("after restart %+v", e)
	}
	if _, ok := s2.Table().Learned[1000]["bert"][t4]; ok {
		t.Fatal("a seed was written to the state file")
	}
	api := s2.Table().API(1000, false)
	if len(api.Profiles) != 2 || api.Profiles[0].Task != "bert" || api.Profiles[0].Models[0].Seconds != 151 || api.Learned != nil {
		t.Fatalf("API = %+v", api)
	}
	// Another user sees nothing of uid 1000's runs; an admin sees them by uid.
	if other := s2.Table().API(1001, false); len(other.Profiles) != 0 || other.Learned != nil {
		t.Fatalf("uid 1001's API = %+v", other)
	}
	admin := s2.Table().API(0, true)
	if len(admin.Learned) != 1 || admin.Learned[0].UID != 1000 || len(admin.Learned[0].Profiles) != 2 {
		t.Fatalf("admin's API = %+v", admin)
	}
	if st, err := os.Stat(filepath.Join(dir, fileName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("profiles.json: %v, %v; want mode 0600", st.Mode(), err)
	}
}

// TestDamagedFileIsSetAside: a file that does not parse is kept beside
// under another name, and the table starts empty.
func TestDamagedFileIsSetAside(t *testing.T) {
	for _, body := range []string{"{", `{"schema":"other"}`, `{"schema":"gpulet.profiles/v1","tasks":{"x":{"m":{"seconds":-1,"runs":1}}}}`} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, fileName), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, quiet)
		if err != nil || len(s.Table().Learned) != 0 {
			t.Fatalf("%s: %v", body, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, fileName+".damaged")); err != nil || string(b) != body {
			t.Errorf("%s: set aside %q, %v", body, b, err)
		}
	}
}

func TestLimits(t *testing.T) {
	s, err := Open(t.TempDir(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < MaxModelsPerTask; i++ {
		if err := s.Record("t", string(rune('A'+i)), 1000, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record("t", "one too many", 1000, time.Second); err == nil {
		t.Fatal("a model past the limit was kept")
	}
	// One uid brings in at most MaxTasksPerUID tasks, across restarts;
	// another uid and root are not held back by it.
	for i := 1; i < MaxTasksPerUID; i++ {
		if err := s.Record(fmt.Sprint("task", i), t4, 1000, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record("one task too many", t4, 1000, time.Second); err == nil || !strings.Contains(err.Error(), "uid 1000 has measured runs of 256 tasks already") {
		t.Fatalf("uid 1000's task past its cap: %v", err)
	}
	if err := s.Record("task1", t4, 1000, time.Second); err != nil {
		t.Fatalf("a run of a task it has: %v", err)
	}
	s2, err := Open(s.path[:len(s.path)-len(fileName)-1], quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Record("one task too many", t4, 1000, time.Second); err == nil {
		t.Fatal("the cap was forgotten across a restart")
	}
	for _, uid := range []uint32{1001, 0} {
		if err := s2.Record(fmt.Sprint("other", uid), t4, uid, time.Second); err != nil {
			t.Fatalf("uid %d: %v", uid, err)
		}
	}
}

// TestWriteFailureKeepsTheOldFile: a run that cannot be written is an error,
// and the file on disk stays whole.
func TestWriteFailureKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record("t", t4, 1000, time.Second); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, fileName))
	s.path = filepath.Join(dir, "missing", fileName)
	if err := s.Record("t", t4, 1000, time.Second); err == nil {
		t.Fatal("write into a missing folder succeeded")
	}
	after, _ := os.ReadFile(filepath.Join(dir, fileName))
	if string(before) != string(after) {
		t.Fatal("the old file changed")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"":{}}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}},"owners":{"x":1000}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"1000":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"-1":{}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"4294967296":{}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","tasks":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, _, err := decode(b)
		if err != nil {
			return
		}
		kept := 0
		for _, tasks := range m {
			kept += len(tasks)
			for task, models := range tasks {
				for model, e := range models {
					if task == "" || model == "" || e.Mean <= 0 || e.Runs < 1 {
						t.Fatalf("accepted %q %q %+v", task, model, e)
					}
				}
			}
		}
		if kept > MaxTasks {
			t.Fatalf("accepted %d tasks", kept)
		}
	})
}

// TestOlderSharedFileIsMigrated: a file of the shared format is read, each
// task's figures going to the uid whose run brought it in (a task without
// one is dropped), and written again at once in the current format, 0600.
func TestOlderSharedFileIsMigrated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, fileName)
	old := `{"schema":"gpulet.profiles/v1","tasks":{"bert":{"Tesla T4":{"seconds":12.5,"runs":3}},"orphan":{"Tesla T4":{"seconds":1,"runs":1}}},"owners":{"bert":1000}}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if e := s.Table().Learned[1000]["bert"][t4]; e.Mean != 12500*time.Millisecond || e.Runs != 3 {
		t.Fatalf("uid 1000's bert on the T4: %+v", e)
	}
	if len(s.Table().Learned) != 1 || len(s.Table().Learned[1000]) != 1 {
		t.Fatalf("learned after the migration: %+v", s.Table().Learned)
	}
	if got := s.Prefer(1001, "bert"); got != nil {
		t.Fatalf("another uid inherits the migrated figures: %v", got)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("migrated file: %v, %v; want mode 0600", st.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"schema": "gpulet.profiles/v2"`) || strings.Contains(string(b), "orphan") {
		t.Fatalf("migrated file:\n%s", b)
	}
	// A current file left readable by others is made private at start.
	os.Chmod(path, 0o644)
	if _, err := Open(dir, quiet); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("reopened file: %v, %v; want mode 0600", st.Mode(), err)
	}
}
