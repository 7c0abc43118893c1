package lease

import (
	"log/slog"
	"time"
)

// leaseLinesPerSecond bounds the "lease granted" and "lease ended" lines.
// Past it, lines are counted instead, and one line says how many were left
// out: under heavy churn the lines cost more than the leases, and journald's
// default rate limit (10,000 lines per 30 s per service) would drop them
// anyway. gpulet_leases_granted_total and gpulet_leases_ended_total count
// every lease. (These lines are queued under the lock and written after it,
// so they keep a budget of their own rather than internal/ratelog's.)
const leaseLinesPerSecond = 100

type lineBudget struct {
	window  time.Time // start of the current second
	used    int
	skipped int
}

// leaseLineDueLocked says whether a per-lease info line may be queued within
// the budget of leaseLinesPerSecond, and counts it as left out when not. The
// caller builds the line only when it may: under churn nearly every line is
// left out, and its attributes would cost more than the check.
func (m *Manager) leaseLineDueLocked() bool {
	m.rollLinesLocked()
	if m.lines.used >= leaseLinesPerSecond {
		m.lines.skipped++
		return false
	}
	m.lines.used++
	return true
}

// rollLinesLocked starts a new second of the line budget once the current
// one is over, saying first how many lines it left out.
func (m *Manager) rollLinesLocked() {
	now := m.clock.Now()
	if d := now.Sub(m.lines.window); d >= 0 && d < time.Second {
		return
	}
	if m.lines.skipped > 0 {
		m.infoLocked("lease lines left out: more than the budget a second", slog.Int("left_out", m.lines.skipped),
			slog.Int("budget", leaseLinesPerSecond), slog.Time("since", m.lines.window))
	}
	m.lines = lineBudget{window: now}
}
