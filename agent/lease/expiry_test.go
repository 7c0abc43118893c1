package lease

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	accounting "github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestEndCarriesTheMeasuredPeak: a lease's end records and logs the peak the
// accounting measured for it; a lease the accounting never saw ends without
// one.
func TestEndCarriesTheMeasuredPeak(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	var logs testutil.SyncBuffer
	acct := accounting.New()
	m := f.manager(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Usage = acct
	})
	measured, err := m.Acquire(t.Context(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	unseen, err := m.Acquire(t.Context(), root, ttlReq(1, "1h"))
	if err != nil {
		t.Fatal(err)
	}
	// The accountant saw the measured lease's process use 8000 MiB, then
	// less; it never saw the other lease.
	for _, used := range []uint64{8000, 10} {
		acct.Update(accounting.Input{Now: time.Now(), MemoryTotalMiB: []uint64{f.devs[0].MemoryTotalMiB},
			Processes: [][]inventory.Process{{{PID: 4242, MemoryUsedMiB: used}}},
			Leases:    []accounting.Lease{{ID: measured.ID, PID: 4242}}})
	}
	for _, id := range []string{measured.ID, unseen.ID} {
		if err := m.Release(root, id); err != nil {
			t.Fatal(err)
		}
	}
	journal, err := os.ReadFile(filepath.Join(f.dir, "leases.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(journal, []byte(`{"op":"end","id":"`+measured.ID+`","peak_memory_mib":8000}`)) ||
		!bytes.Contains(journal, []byte(`{"op":"end","id":"`+unseen.ID+`"}`)) {
		t.Fatalf("journal lacks the end records, the measured one with its peak:\n%s", journal)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "lease ended") && strings.Contains(line, measured.ID) != strings.Contains(line, "peak_memory_mib=8000") {
			t.Fatalf("log line %q: want the peak on the measured lease's end alone", line)
		}
	}
	if n := strings.Count(logs.String(), "lease ended"); n != 2 {
		t.Fatalf("%d lease ended lines, want 2:\n%s", n, logs.String())
	}
}
