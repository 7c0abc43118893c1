package test

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkTaskProlog is `srun --gres=shard:1 true` as a plain user on a real
// one-node Slurm, with gpulet's task prolog (which leases for the task and
// prints its environment), with /bin/true as the task prolog (what Slurm's
// running any task prolog costs, the floor), and with none (a plain step), in
// rounds of 11 steps each (the prolog set by reconfiguring Slurm between
// them), the order turning each round, so that all see the same moments of
// the machine. It reports the medians over rounds of each side and of what
// gpulet's prolog adds to a plain step and to the floor.
// Goal (issue 26): the task prolog adds ≤ 20 ms to a plain step (median of 11).
//
//	go test -run '^$' -bench TaskProlog -benchtime 3x ./test/
func BenchmarkTaskProlog(b *testing.B) {
	c := startSlurm(b)
	alice := c.users[0]
	step := func() time.Duration {
		t0 := time.Now()
		if out, err := c.run(alice, "srun", "--gres=shard:1", "true"); err != nil {
			b.Fatalf("srun: %v\n%s", err, out)
		}
		return time.Since(t0)
	}
	median := func(prolog string) time.Duration {
		c.setTaskProlog(prolog)
		step() // the first step after a reconfigure pays for it
		d := make([]time.Duration, 11)
		for i := range d {
			d[i] = step()
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	sides := []string{c.prolog, "/bin/true", ""}
	var with, floor, plain, over, overFloor []time.Duration
	for round := range b.N {
		got := map[string]time.Duration{}
		for i := range sides {
			p := sides[(i+round)%len(sides)]
			got[p] = median(p)
		}
		w, f, p := got[c.prolog], got["/bin/true"], got[""]
		with, floor, plain = append(with, w), append(floor, f), append(plain, p)
		over, overFloor = append(over, w-p), append(overFloor, w-f)
	}
	c.setTaskProlog(c.prolog)
	mid := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(mid(plain), "plain-step-ms")
	b.ReportMetric(mid(with), "with-prolog-ms")
	b.ReportMetric(mid(floor), "true-prolog-ms")
	b.ReportMetric(mid(overFloor), "prolog-adds-to-floor-ms")
	b.ReportMetric(mid(over), "prolog-adds-ms")
	b.ReportMetric(float64(slices.Max(over).Microseconds())/1000, "prolog-adds-max-ms")
}
