package memlimit

import (
	"context"
	"math"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

func TestFor(t *testing.T) {
	const floor = 32 << 20
	for _, c := range []struct {
		live uint64
		want int64
	}{
		{0, floor},
		{8 << 20, floor},       // 10,240 leases held: the floor binds
		{12 << 20, floor},      // 2×12+8 = 32 MiB
		{13 << 20, 34 << 20},   // past it, the limit follows the heap
		{100 << 20, 208 << 20}, // a large table: about GOGC 100
		{math.MaxUint64, math.MaxInt64},
	} {
		if got := For(c.live, floor); got != c.want {
			t.Errorf("For(%d MiB) = %d MiB, want %d MiB", c.live>>20, got>>20, c.want>>20)
		}
	}
}

// TestKeepSetsAndRestores runs Keep with a floor far above what the test's heap
// needs, sees the runtime take it, and sees the limit put back when Keep stops.
func TestKeepSetsAndRestores(t *testing.T) {
	const floor = 1 << 40
	before := debug.SetMemoryLimit(-1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { Keep(ctx, floor, time.Millisecond) })
	testutil.Eventually(t, "the limit to become the floor", func() bool { return debug.SetMemoryLimit(-1) == floor })
	cancel()
	wg.Wait()
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("the limit is %d after Keep stopped, want %d as before", got, before)
	}
}
