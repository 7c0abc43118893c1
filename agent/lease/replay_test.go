package lease

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestReplayKeepsWhatFollowsDamageAndNamesWhatItLost: damage in an old
// record, a line far too long and an unknown operation, all before the live
// leases' records, cost nothing but themselves; a lease whose own grant is
// damaged is lost, and the log names it and every skipped record.
func TestReplayKeepsWhatFollowsDamageAndNamesWhatItLost(t *testing.T) {
	f := newFixture(t, 1, 4, 2)
	m := f.manager(t)
	old, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Release(root, old.ID); err != nil {
		t.Fatal(err)
	}
	_, proc := processLease(t, m)
	live := []string{proc.ID}
	for i := 0; i < 5; i++ {
		l, err := m.Acquire(context.Background(), root, ttlReq(1, "1h"))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, l.ID)
	}
	m.Close()
	path := filepath.Join(f.dir, "leases.journal")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	// lines: schema, old's grant, old's end, proc, then the five.
	if len(lines) != 10 || lines[9] != "" || !strings.Contains(lines[1], old.ID) || !strings.Contains(lines[8], live[5]) {
		t.Fatalf("journal not as expected:\n%s", b)
	}
	flip := []byte(lines[1])
	flip[len(flip)-10] ^= 0x20
	lost := live[4]
	damagedGrant := []byte(lines[7])
	damagedGrant[len(damagedGrant)/2] ^= 0x01
	out := lines[0] + string(flip) +
		strings.Repeat("x", 2<<20) + "\n" +
		recordLine(t, journal.Record{Op: "compact"}) +
		lines[2] + lines[3] + lines[4] + lines[5] + lines[6] + string(damagedGrant) + lines[8]
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	var log testutil.SyncBuffer
	m2 := f.manager(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	want := slices.DeleteFunc(slices.Clone(live), func(id string) bool { return id == lost })
	if got := leaseIDs(m2.View()); !slices.Equal(got, sortedIDs(want...)) {
		t.Fatalf("after replay %v, want %v\nlog:\n%s", got, want, log.String())
	}
	for _, s := range []string{
		`line=2 why="checksum mismatch" names_lease=` + old.ID,
		`line=3 why="line of 2097152 bytes, longer than a record may be (1048576)"`,
		`line=4 why="unknown operation \"compact\""`,
		`line=10 why="checksum mismatch" names_lease=` + lost,
		`msg="lease dropped at replay" lease=` + lost + ` line=10 why="its grant record is damaged"`,
	} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log does not say %s:\n%s", s, log.String())
		}
	}
	// The lost lease's FIFO is nobody's now: it goes, and its unit is free.
	testutil.Eventually(t, "the lost lease's FIFO to go", func() bool {
		m2.probeOffline()
		return m2.View().GPUs[0].Used+m2.View().GPUs[1].Used == len(want)
	})
}

func leaseIDs(v *View) []string {
	var ids []string
	for _, l := range v.Leases() {
		ids = append(ids, l.ID)
	}
	slices.Sort(ids)
	return ids
}

func sortedIDs(ids ...string) []string {
	return slices.Sorted(slices.Values(ids))
}

// recordLine is r's line as the journal writes it.
func recordLine(t testing.TB, r journal.Record) string {
	b, err := journal.AppendRecord(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
