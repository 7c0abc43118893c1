// Package memlimit keeps the Go runtime's soft memory limit in step with a
// daemon's live heap. A daemon that runs the collector at a slow pace for
// throughput (GOGC well above 100, which costs little on a small heap) lets
// garbage grow to several times a large heap; a soft limit near what the heap
// needs bounds that, and following the live heap up keeps the limit from ever
// making the collector run without pause.
package memlimit

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// headroom is what the runtime keeps beside the live heap (goroutine stacks,
// the collector's metadata, free spans not yet returned) with room left for
// the garbage of a round of work.
const headroom = 8 << 20

// For is the limit for a live heap of live bytes: floor, or twice the live
// heap and the headroom where that is more. Below it the collector keeps its
// own pace; a limit the live heap came near would have it run back to back,
// at up to half the CPU.
func For(live uint64, floor int64) int64 {
	if live > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return max(floor, 2*int64(live)+headroom)
}

// liveHeap is the heap the last collection found live.
const liveHeap = "/gc/heap/live:bytes"

// Keep sets the soft memory limit from the live heap now and every period
// until ctx ends, then puts back the limit it found.
func Keep(ctx context.Context, floor int64, period time.Duration) {
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	sample := []metrics.Sample{{Name: liveHeap}}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			debug.SetMemoryLimit(For(sample[0].Value.Uint64(), floor))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
