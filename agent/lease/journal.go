package lease

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpulet/gpulet/api"
)

// JournalSchema names the journal's format.
const JournalSchema = "gpulet.journal/v1"

// journal is what <run-dir>/leases.json holds: every live lease with what is
// needed to take it back after a crash of the daemon. It lives in the run dir
// (tmpfs in production) because leases cannot outlive a reboot, and is written
// by rename without fsync: it must survive the daemon's crash, not the kernel's.
type journal struct {
	Schema string         `json:"schema"`
	Leases []journalEntry `json:"leases"`
}

type journalEntry struct {
	Lease api.Lease `json:"lease"`
	// StartTime is the holder process's start time (process-bound leases).
	StartTime uint64 `json:"start_time,omitempty"`
	// Deadline is when a time-bound lease ends unless renewed.
	Deadline *time.Time `json:"deadline,omitempty"`
	// TTLNanos is the renewal period of a time-bound lease.
	TTLNanos int64 `json:"ttl_ns,omitempty"`
}

// gpuShape is what the decoder checks entries against.
type gpuShape struct {
	UUID        string
	UnitsTotal  int
	InstanceOf  func(unit int) int
	UnitsPerMax int
}

// decodeJournal parses a journal and checks it against the node's GPUs.
// Malformed JSON is an error (the caller rebuilds from the ledger); entries that
// do not fit the node (unknown GPU, bad units, a unit in two leases) are dropped
// and listed in dropped.
func decodeJournal(b []byte, gpus []gpuShape) (entries []journalEntry, dropped []string, err error) {
	var j journal
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, nil, fmt.Errorf("journal: %w", err)
	}
	if j.Schema != JournalSchema {
		return nil, nil, fmt.Errorf("journal: schema %q, want %q", j.Schema, JournalSchema)
	}
	taken := map[[2]int]bool{}
	ids := map[string]bool{}
	for _, e := range j.Leases {
		if why := checkEntry(e, gpus, taken, ids); why != "" {
			dropped = append(dropped, fmt.Sprintf("lease %q: %s", e.Lease.ID, why))
			continue
		}
		for _, u := range e.Lease.Units {
			taken[[2]int{e.Lease.GPU.Index, u}] = true
		}
		ids[e.Lease.ID] = true
		entries = append(entries, e)
	}
	return entries, dropped, nil
}

func checkEntry(e journalEntry, gpus []gpuShape, taken map[[2]int]bool, ids map[string]bool) string {
	l := e.Lease
	if !validID(l.ID) || ids[l.ID] {
		return "bad or repeated id"
	}
	if l.GPU.Index < 0 || l.GPU.Index >= len(gpus) || gpus[l.GPU.Index].UUID != l.GPU.UUID {
		return "GPU not on this node"
	}
	g := gpus[l.GPU.Index]
	if len(l.Units) == 0 || len(l.Units) > g.UnitsPerMax {
		return "bad unit count"
	}
	for _, u := range l.Units {
		if u < 0 || u >= g.UnitsTotal || g.InstanceOf(u) != l.Instance || taken[[2]int{l.GPU.Index, u}] {
			return "bad or shared unit"
		}
	}
	if (e.Deadline == nil) == (l.Owner.PID == 0) {
		return "neither or both of process and deadline"
	}
	if e.Deadline != nil && e.TTLNanos <= 0 {
		return "deadline without ttl"
	}
	return ""
}

// validID accepts the ids newID makes.
func validID(id string) bool {
	if len(id) != len(idPrefix)+idHexLen || id[:len(idPrefix)] != idPrefix {
		return false
	}
	for _, r := range id[len(idPrefix):] {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

func jsonMarshal(j journal) ([]byte, error) {
	b, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
