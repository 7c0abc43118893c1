package lease

import (
	"log/slog"
	"time"

	"github.com/gpulet/gpulet/internal/clock"
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
	clock clock.Clock
	// info queues a line for the table's unlock to write.
	info    func(msg string, attrs ...slog.Attr)
	window  time.Time // start of the current second
	used    int
	skipped int
}

// due says whether a per-lease info line may be queued within
// the budget of leaseLinesPerSecond, and counts it as left out when not. The
// caller builds the line only when it may: under churn nearly every line is
// left out, and its attributes would cost more than the check.
func (b *lineBudget) due() bool {
	b.roll()
	if b.used >= leaseLinesPerSecond {
		b.skipped++
		return false
	}
	b.used++
	return true
}

// roll starts a new second of the line budget once the current
// one is over, saying first how many lines it left out.
func (b *lineBudget) roll() {
	now := b.clock.Now()
	if d := now.Sub(b.window); d >= 0 && d < time.Second {
		return
	}
	if b.skipped > 0 {
		b.info("lease lines left out: more than the budget a second", slog.Int("left_out", b.skipped),
			slog.Int("budget", leaseLinesPerSecond), slog.Time("since", b.window))
	}
	b.window, b.used, b.skipped = now, 0, 0
}
