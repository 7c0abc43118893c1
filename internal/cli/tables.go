package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpulet/gpulet/api"
)

// The tables gpulet prints: status, GPUs, leases.

// maxBar is the widest unit bar; a GPU with more units gets a scaled one.
const maxBar = 64

// UnitBar draws a GPU's units: # leased, o offline, r reserved, . free, one
// character per unit, or scaled to maxBar characters for larger GPUs.
func UnitBar(g api.GPU) string {
	parts := []struct {
		c byte
		n int
	}{{'#', g.UnitsUsed - g.UnitsOffline}, {'o', g.UnitsOffline}, {'r', g.UnitsReserved}, {'.', g.UnitsFree}}
	total := 0
	for i := range parts {
		parts[i].n = max(parts[i].n, 0)
		total += parts[i].n
	}
	width := min(total, maxBar)
	var b strings.Builder
	b.WriteByte('[')
	// Each kind ends where its running sum ends, scaled; a kind with any unit
	// gets at least one character so that a single offline claim shows.
	drawn, sum := 0, 0
	for _, p := range parts {
		sum += p.n
		end := drawn
		if total > 0 {
			end = (sum*width + total - 1) / total
		}
		if p.n > 0 && end == drawn && drawn < width {
			end = drawn + 1
		}
		end = min(end, width)
		b.WriteString(strings.Repeat(string(p.c), end-drawn))
		drawn = end
	}
	b.WriteByte(']')
	return b.String()
}

// WriteStatus prints the status table of a snapshot.
func WriteStatus(w io.Writer, s *api.Snapshot) {
	backend := s.Backend
	if backend == api.BackendSimulated {
		backend = "simulated (no real GPU)"
	}
	fmt.Fprintf(w, "node %s  state: %s  backend: %s  mps: %s\n", Printable(s.Node), Printable(s.State), Printable(backend), Printable(s.MPS))
	if s.Reason != "" {
		fmt.Fprintf(w, "node %s: %s\n", Printable(s.State), Printable(s.Reason))
	}
	if s.ConfigError != "" {
		fmt.Fprintf(w, "config: %s\n", Printable(s.ConfigError))
	}
	tw := newTable(w, "GPU", "NAME", "STATE", "ELIGIBLE", "UNITS", "LEASED/OFFLINE/RESERVED/FREE", "UTIL", "MEMORY USED/HELD/TOTAL (MiB)", "MPS")
	var notes []string
	for _, g := range s.GPUs {
		var inst []string
		for _, in := range g.Instances {
			v := in.State
			if in.UID != nil {
				v += fmt.Sprintf(" uid %d", *in.UID)
			}
			inst = append(inst, fmt.Sprintf("%d:%s", in.Instance, v))
			if in.Error != "" {
				notes = append(notes, fmt.Sprintf("GPU %d instance %d: %s", g.Index, in.Instance, in.Error))
			}
		}
		switch {
		case g.Xid != 0:
			notes = append(notes, fmt.Sprintf("GPU %d: %s (after a look at the GPU, an admin clears it: gpulet undrain --gpu %d)", g.Index, g.Error, g.Index))
		case g.Error != "":
			notes = append(notes, fmt.Sprintf("GPU %d: %s", g.Index, g.Error))
		}
		if !g.Eligible && g.State == api.GPUWorking && g.UtilizationPct > g.MaxUtilizationPct {
			notes = append(notes, fmt.Sprintf("GPU %d: %d%% of its SMs busy, above the %d%% that takes new leases", g.Index, g.UtilizationPct, g.MaxUtilizationPct))
		}
		notes = append(notes, usageNotes(g)...)
		tw.row(fmt.Sprint(g.Index), g.Name, g.State, yesNo(g.Eligible), UnitBar(g),
			// The bar's four kinds, in its order, so that they add up to the GPU's
			// units (units_used counts offline claims too).
			fmt.Sprintf("%d/%d/%d/%d", g.UnitsUsed-g.UnitsOffline, g.UnitsOffline, g.UnitsReserved, g.UnitsFree),
			utilCell(g), fmt.Sprintf("%d/%d/%d", g.MemoryUsedMiB, g.MemoryHeldMiB, g.MemoryTotalMiB), strings.Join(inst, " "))
	}
	tw.flush()
	notes = append(notes, overQuotaNotes(s.OverQuota)...)
	for _, n := range notes {
		fmt.Fprintln(w, Printable(n))
	}
	fmt.Fprintf(w, "total: %d units, %d free, %d reserved   (# leased  o offline  r reserved  . free)\n", s.UnitsTotal, s.UnitsFree, s.UnitsReserved)
	for _, r := range s.Reservations {
		if r.State == api.ReservationPending {
			fmt.Fprintf(w, "reservation %s: pending, priority %d, %d unit(s) held for it\n", Printable(r.Name), r.Priority, r.Held)
			continue
		}
		fmt.Fprintf(w, "reservation %s: stage %d/%d needs %d of %d reserved; in use %d, lent %d of %d lendable, reclaimed %d\n",
			Printable(r.Name), r.Stage+1, r.Stages, r.Need, r.Reserved, r.InUse, r.Lent, r.Lendable, r.Reclaimed)
	}
	if s.View != nil {
		if s.View.Mounted {
			fmt.Fprintf(w, "view: %s\n", Printable(s.View.Mount))
		} else {
			fmt.Fprintf(w, "view: not mounted: %s\n", Printable(s.View.Error))
		}
	}
	for _, u := range s.Upstreams {
		last := "no push yet"
		if u.LastSuccess != nil {
			last = fmt.Sprintf("last push %s (seq %d), %d in all", u.LastSuccess.Format(time.RFC3339), u.LastSeq, u.Pushes)
		}
		fmt.Fprintf(w, "upstream %s: %s", Printable(u.URL), last)
		if u.Failures > 0 {
			fmt.Fprintf(w, "; failing (%d in a row): %s", u.Failures, Printable(u.LastError))
		}
		fmt.Fprintln(w)
	}
}

// WriteGPUs prints what each GPU is: its card's figures and its units.
func WriteGPUs(w io.Writer, l *api.GPUList) {
	tw := newTable(w, "GPU", "NAME", "CC", "MEMORY (MiB)", "BANDWIDTH (GB/s)", "SM CLOCK (MHz)", "UNITS FREE", "STATE")
	known := func(v int) string {
		if v == 0 {
			return "-"
		}
		return strconv.Itoa(v)
	}
	for _, g := range l.GPUs {
		c := g.Capability
		cc := c.ComputeCapability
		if cc == "" || cc == (api.ComputeCapability{}).String() {
			cc = "-"
		}
		tw.row(strconv.Itoa(g.Index), g.Name, cc, strconv.FormatUint(g.MemoryTotalMiB, 10), known(c.MemoryBandwidthGBps),
			known(c.MaxSMClockMHz), fmt.Sprintf("%d/%d", g.UnitsFree, g.UnitsTotal), g.State)
	}
	tw.flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteLeases prints a lease table, by GPU and unit.
func WriteLeases(w io.Writer, ls []api.Lease) {
	if len(ls) == 0 {
		fmt.Fprintln(w, "no leases")
		return
	}
	ls = append([]api.Lease(nil), ls...)
	first := func(l api.Lease) int {
		if len(l.Units) == 0 {
			return -1
		}
		return l.Units[0]
	}
	sort.SliceStable(ls, func(i, j int) bool {
		if ls[i].GPU.Index != ls[j].GPU.Index {
			return ls[i].GPU.Index < ls[j].GPU.Index
		}
		return first(ls[i]) < first(ls[j])
	})
	tw := newTable(w, "ID", "GPU", "INSTANCE", "UNITS", "USER", "PID", "COMMAND", "MEMORY USED/PEAK (MiB)", "EXPIRES", "TASK")
	names := owners{}
	for _, l := range ls {
		exp, pid := "when pid exits", fmt.Sprint(l.Owner.PID)
		command := commandOf(l.Owner.PID)
		switch {
		case l.Expires != nil:
			exp = l.Expires.Local().Format(time.DateTime)
		case l.Binding == "pod":
			exp, pid, command = "when pod ends", "-", "-"
		}
		task := l.Task
		if l.Pod != nil && l.Pod.Name != "" {
			task = strings.TrimSpace("pod " + l.Pod.Namespace + "/" + l.Pod.Name + " " + task)
		}
		if l.Slurm != nil {
			exp, pid, task = slurmLeaseColumns(l, task)
			command = "-"
		}
		if task == "" {
			task = "-"
		}
		if l.Preemptible {
			task += " (preemptible)"
		}
		gpu, instance, units := fmt.Sprint(l.GPU.Index), fmt.Sprint(l.Instance), unitList(l.Units)
		if len(l.GPUs) > 0 {
			gpu, instance, units = wholeGPUList(l.GPUs), "-", "all"
		}
		tw.row(l.ID, gpu, instance, units, names.name(l.Owner.UID), pid, command, usageCell(l.Usage), exp, task)
	}
	tw.flush()
}

// wholeGPUList writes a whole-GPU lease's GPUs in CUDA_VISIBLE_DEVICES
// order: "2,3".
func wholeGPUList(gpus []api.LeaseGPU) string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = fmt.Sprint(g.Index)
	}
	return strings.Join(out, ",")
}

// unitList writes unit indices with runs folded: "0-3,7".
func unitList(us []int) string {
	var parts []string
	for i := 0; i < len(us); {
		j := i
		for j+1 < len(us) && us[j+1] == us[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", us[i], us[j]))
		} else {
			parts = append(parts, fmt.Sprint(us[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
