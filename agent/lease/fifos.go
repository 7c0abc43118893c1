package lease

import (
	"errors"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/placement"
)

// fifoKeeper is the table's side of the pipe-file ledger: it makes and
// removes the FIFOs of leased units and counts the watch events that its own
// changes cause (slot.own), so that the ledger's watch tells them from an
// offline claimer's. It works on the table under its lock.
type fifoKeeper struct{ t *Manager }

// createLocked makes the FIFO of unit u of GPU g and counts the watch
// event that this causes as the daemon's own.
func (f *fifoKeeper) createLocked(g, u int) error {
	err := f.t.cfg.Ledger.Create(g, u)
	if err == nil {
		f.t.gpus[g].slots[u].own++
	}
	return err
}

// removeLocked removes the FIFO of unit u of GPU g, counting the watch
// event of a removal as the daemon's own.
func (f *fifoKeeper) removeLocked(g, u int) (bool, error) {
	removed, err := f.t.cfg.Ledger.Remove(g, u)
	if removed {
		f.t.gpus[g].slots[u].own++
	}
	return removed, err
}

func (f *fifoKeeper) removeLeaseLocked(l *lease) {
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			if _, err := f.removeLocked(g, u); err != nil {
				f.t.log.Error("cannot remove pipe file", "lease", l.ID, "err", err)
			}
		}
	}
}

// removeUnheldLocked removes the FIFOs of a lease that restore drops,
// but not one an offline claimer holds: when the lease's end could not be
// recorded before a crash, its units may have been claimed since.
func (f *fifoKeeper) removeUnheldLocked(l *lease) {
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			if f.t.cfg.Ledger.Held(g, u) {
				continue
			}
			if _, err := f.removeLocked(g, u); err != nil {
				f.t.log.Error("cannot remove pipe file", "lease", l.ID, "err", err)
			}
		}
	}
}

// recreateLocked makes the missing FIFOs of a lease kept from the
// journal. When an offline claimer holds one of its units now, it removes the
// FIFOs it made again, leaves every other (a claimer may hold more than one of
// the lease's units), and returns that unit; else -1.
func (f *fifoKeeper) recreateLocked(l *lease) int {
	var made [][2]int // GPU, unit
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			var err error
			switch {
			case f.t.cfg.Ledger.Present(g, u) && f.t.cfg.Ledger.Held(g, u):
				// The daemon never locks its own FIFOs: this one is a claimer's.
				err = ledger.ErrTaken
			case f.t.cfg.Ledger.Present(g, u):
				continue
			default:
				if err = f.createLocked(g, u); err == nil {
					made = append(made, [2]int{g, u})
				}
			}
			if errors.Is(err, ledger.ErrTaken) {
				for _, v := range made {
					f.removeLocked(v[0], v[1])
				}
				return u
			}
			if err != nil {
				f.t.log.Error("cannot recreate pipe file of a kept lease", "lease", l.ID, "err", err)
			}
		}
	}
	return -1
}

// createUnitsLocked makes the FIFOs of units of GPU g. When one is there
// already it undoes the others, counts what is there, and reports retry: the
// table changed, so place again.
func (f *fifoKeeper) createUnitsLocked(g int, units []int) (retry bool, err error) {
	for n, u := range units {
		err := f.createLocked(g, u)
		if err == nil {
			continue
		}
		for _, v := range units[:n] {
			f.removeLocked(g, v)
		}
		if !errors.Is(err, ledger.ErrTaken) {
			return false, err
		}
		if f.t.cfg.Ledger.Present(g, u) {
			// An offline claimer was first.
			f.t.applyLocked(g, u, true)
			return true, nil
		}
		// Something that is no FIFO sits at the unit's name: no claim, but the
		// unit cannot be leased until the ledger's sweep (every sample
		// interval) has removed it, so it is left out meanwhile. Each retry
		// blocks one more unit, so the placement loop ends.
		s := &f.t.gpus[g].slots[u]
		s.state = slotBlocked
		f.t.touchLocked(g)
		return true, nil
	}
	return false, nil
}

// createChoiceLocked makes the FIFOs of the units that c takes.
func (f *fifoKeeper) createChoiceLocked(c placement.Choice) (retry bool, err error) {
	if len(c.GPUs) > 0 {
		return f.createWholeLocked(c.GPUs)
	}
	return f.createUnitsLocked(c.GPU, c.Units)
}

// createWholeLocked makes the FIFOs of every unit of the GPUs gpus, or
// none of them (retry: the table changed, place again).
func (f *fifoKeeper) createWholeLocked(gpus []int) (retry bool, err error) {
	units := allUnits(f.t.cfg.Model)
	for n, g := range gpus {
		retry, err := f.createUnitsLocked(g, units)
		if err == nil && !retry {
			continue
		}
		for _, h := range gpus[:n] {
			for _, u := range units {
				f.removeLocked(h, u)
			}
		}
		return retry, err
	}
	return false, nil
}
