package cli

import (
	"fmt"
	"strings"

	"github.com/gpulet/gpulet/api"
)

// utilCell is the status table's utilization: the SM share the threshold
// compares, and, where it differs, the share of time any kernel ran, which
// reads 100% for one small job and so says little about room left.
func utilCell(g api.GPU) string {
	if g.UtilizationSource == api.UtilSourceDevice || g.KernelTimePct == g.UtilizationPct {
		return fmt.Sprintf("%d%%", g.UtilizationPct)
	}
	return fmt.Sprintf("%d%% SM (kernel %d%%)", g.UtilizationPct, g.KernelTimePct)
}

// usageNotes says what the accounting found wrong on a GPU.
func usageNotes(g api.GPU) []string {
	var notes []string
	if len(g.OutsideProcesses) > 0 {
		pids := make([]string, len(g.OutsideProcesses))
		for i, p := range g.OutsideProcesses {
			pids[i] = fmt.Sprint(p.PID)
			if p.UID != nil {
				pids[i] += fmt.Sprintf(" of uid %d", *p.UID)
			}
		}
		n := fmt.Sprintf("GPU %d: processes beside gpulet use %d MiB (pid %s)", g.Index, g.OutsideMemoryMiB, strings.Join(pids, ", "))
		if g.OutsideOverShare {
			n += ", more than the leases leave free: they eat into leased shares"
		}
		notes = append(notes, n)
	}
	if g.LeasesOverShare > 0 {
		notes = append(notes, fmt.Sprintf("GPU %d: %d lease(s) or claim(s) use more memory than their share (gpulet leases --all)", g.Index, g.LeasesOverShare))
	}
	if g.UtilizationSource == api.UtilSourceDevice {
		notes = append(notes, fmt.Sprintf("GPU %d: gives no SM utilization, only the time any kernel runs; --max-utilization does not apply to it", g.Index))
	}
	return notes
}

// usageCell is a lease's measured memory, "-" before it was measured, with a
// mark when it is over the lease's share.
func usageCell(u *api.Usage) string {
	if u == nil {
		return "-"
	}
	s := fmt.Sprintf("%d/%d", u.MemoryUsedMiB, u.MemoryPeakMiB)
	if u.OverShare {
		s += " over share"
	}
	return s
}
