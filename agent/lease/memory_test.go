package lease

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
	"golang.org/x/sys/unix"
)

// a100 is a fixture of one simulated A100 80 GB (81920 MiB) under the
// default unit model: 16 units, one instance.
func a100(t *testing.T) *fixture {
	t.Helper()
	return fixtureOf(t, runDir(t), units.Default(), inventory.Models[5])
}

func memReq(units int, mib uint64) Request {
	r := ttlReq(units, "1h")
	r.MemoryMiB = mib
	return r
}

// TestMemoryAskedIsHeld: three 1-unit leases of 60 GiB each on one 80 GB
// GPU: the first is granted, the second is refused for memory (a waiting
// one gets the memory once the first ends), as units would be.
func TestMemoryAskedIsHeld(t *testing.T) {
	m := a100(t).manager(t)
	ctx := context.Background()
	first, err := m.Acquire(ctx, root, memReq(1, 61440))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.View().GPUs[0].HeldMemoryMiB; got != 61440 {
		t.Fatalf("held memory %d MiB, want 61440", got)
	}
	_, err = m.Acquire(ctx, root, memReq(1, 61440))
	if !errors.Is(err, api.ErrInsufficientUnits) || errors.Is(err, placement.ErrNeverFits) || !strings.Contains(err.Error(), "MiB") {
		t.Fatalf("second 60 GiB lease beside a held one: %v, want insufficient_units naming memory", err)
	}
	// 20 GiB is left beside the first: a lease of it fits, and one unit's
	// share (5 GiB) more does not.
	if _, err := m.Acquire(ctx, root, memReq(3, 20480)); err != nil {
		t.Fatalf("a lease of the 20 GiB left: %v", err)
	}
	if _, err := m.Acquire(ctx, root, ttlReq(1, "1h")); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a lease of one unit's share on a GPU whose memory is all held: %v", err)
	}
	w := memReq(1, 61440)
	w.Wait = 10 * time.Second
	got := make(chan error, 1)
	go func() {
		_, err := m.Acquire(ctx, root, w)
		got <- err
	}()
	for waiting(m) == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := m.Release(root, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiting 60 GiB lease once the first ended: %v", err)
	}
}

// TestMemoryShareIsHeld: a lease that asks no memory holds its units'
// share, a whole-GPU lease all of it, and offline claims and reserved units
// one unit's share each; what they hold leaves that much less for others.
func TestMemoryShareIsHeld(t *testing.T) {
	f := a100(t)
	m := f.manager(t)
	ctx := context.Background()
	if _, err := m.Acquire(ctx, root, ttlReq(4, "1h")); err != nil {
		t.Fatal(err)
	}
	fd := claimOffline(t, f, 0, 15)
	t.Cleanup(func() { unix.Close(fd) })
	testutil.Eventually(t, "offline claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	if got, want := m.View().GPUs[0].HeldMemoryMiB, uint64(5*5120); got != want {
		t.Fatalf("4 units leased and 1 claimed hold %d MiB, want %d", got, want)
	}
	// 80 GiB less 25 GiB held: 55 GiB is free, not 56.
	if _, err := m.Acquire(ctx, root, memReq(1, 56*1024)); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a lease of more than the memory left: %v", err)
	}
	if _, err := m.Acquire(ctx, root, memReq(1, 55*1024)); err != nil {
		t.Fatalf("a lease of the memory left: %v", err)
	}
}

// TestWholeGPULeaseHoldsAllItsMemory: a whole-GPU lease holds its GPUs'
// memory, asked or not.
func TestWholeGPULeaseHoldsAllItsMemory(t *testing.T) {
	m := a100(t).manager(t)
	r := ttlReq(0, "1h")
	r.GPUs, r.MemoryMiB = 1, 1024
	if _, err := m.Acquire(context.Background(), root, r); err != nil {
		t.Fatal(err)
	}
	if got := m.View().GPUs[0].HeldMemoryMiB; got != 81920 {
		t.Fatalf("a whole-GPU lease holds %d MiB, want 81920", got)
	}
}

// TestHeldFreeMiB: placement's free memory is what is neither held nor used
// by processes beside gpulet; without accounting, no more than what was
// measured free.
func TestHeldFreeMiB(t *testing.T) {
	for _, tc := range []struct {
		name        string
		total, held uint64
		gc          *GPUCondition
		want        uint64
	}{
		{"no conditions yet", 100, 60, nil, 40},
		{"held, not yet used", 100, 60, &GPUCondition{Accounted: true, MemoryFreeMiB: 100}, 40},
		{"held and used: the measure counts nothing twice", 100, 60, &GPUCondition{Accounted: true, MemoryFreeMiB: 40}, 40},
		{"units let go, not yet sampled again", 100, 0, &GPUCondition{Accounted: true, MemoryFreeMiB: 40}, 100},
		{"outside processes", 100, 60, &GPUCondition{Accounted: true, OutsideMiB: 30, MemoryFreeMiB: 70}, 10},
		{"more held than there is", 100, 120, &GPUCondition{Accounted: true, MemoryFreeMiB: 100}, 0},
		{"without accounting: measured free bounds", 100, 10, &GPUCondition{MemoryFreeMiB: 50}, 50},
		{"without accounting: held bounds", 100, 60, &GPUCondition{MemoryFreeMiB: 100}, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := heldFreeMiB(tc.total, tc.held, tc.gc); got != tc.want {
				t.Fatalf("heldFreeMiB(%d, %d, %+v) = %d, want %d", tc.total, tc.held, tc.gc, got, tc.want)
			}
		})
	}
}

// TestReservedUnitsHoldTheirShare: units set aside for a reservation hold
// their share, so that others' leases and reservations cannot promise that
// memory; a draw on the reservation may use its units' share, and no more.
func TestReservedUnitsHoldTheirShare(t *testing.T) {
	h := &resHarness{t: t, f: a100(t), clock: clock.NewFake(time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)),
		procs: newFakeProcs(), path: filepath.Join(t.TempDir(), reserve.FileName)}
	h.start()
	h.reserve(alice, spec("wf", []int{4}))
	if got := h.m.View().GPUs[0].HeldMemoryMiB; got != 4*5120 {
		t.Fatalf("4 reserved units hold %d MiB, want %d", got, 4*5120)
	}
	ctx := context.Background()
	if _, err := h.m.Acquire(ctx, bob, memReq(1, 61441)); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a lease of more than the reserved units leave: %v", err)
	}
	if _, err := h.m.Acquire(ctx, bob, memReq(1, 61440)); err != nil {
		t.Fatalf("a lease of what the reserved units leave: %v", err)
	}
	if _, err := h.m.Reservations().Reserve(carol, spec("more", []int{1})); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a reservation on a GPU whose memory is all held: %v", err)
	}
	draw := func(mib uint64) error {
		p := h.procs.spawn(false)
		_, err := h.m.Acquire(ctx, alice, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: p.pid, Reservation: "wf", MemoryMiB: mib}})
		return err
	}
	if err := draw(5121); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("a one-unit draw of more than its unit's share: %v", err)
	}
	if err := draw(5120); err != nil {
		t.Fatalf("a one-unit draw of its unit's share: %v", err)
	}
	if err := draw(0); err != nil {
		t.Fatalf("a one-unit draw asking no memory: %v", err)
	}
	if got := h.m.View().GPUs[0].HeldMemoryMiB; got != 81920 {
		t.Fatalf("held %d MiB after the draws, want all 81920", got)
	}
}
