package mpsctl

import (
	"context"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// quiet keeps a benchmark's output to its figures.
func quiet(c *Config) { c.Logger = slog.New(slog.DiscardHandler) }

// BenchmarkProbe is the cost of one health probe (one run of the front end asking
// two questions) against a real running instance.
func BenchmarkProbe(b *testing.B) {
	d, _ := newReal(b, []string{gpuA}, 1, 2*time.Second, quiet)
	if err := d.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	in := d.all[0]
	for b.Loop() {
		if _, err := d.probe(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecover is the time from a control daemon's death (SIGKILL) to
// "running" again when Check is called back to back, with a fixed 1ms backoff
// (killed every few milliseconds, it would otherwise count as a crash loop and
// back off further): the cost of detection and restart, without the agent's
// sample interval.
func BenchmarkRecover(b *testing.B) {
	d, _ := newReal(b, []string{gpuA}, 1, 2*time.Second, quiet, func(c *Config) { c.MaxBackoff = c.MinBackoff })
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	checks := 0
	for b.Loop() {
		pid := d.Status(gpuA)[0].PID
		b.StopTimer()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		if err := waitGone(ctx, pid, 2*time.Second); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for d.Check(ctx); d.Status(gpuA)[0].State != api.InstanceRunning; d.Check(ctx) {
			checks++
		}
		checks++
	}
	b.ReportMetric(float64(checks)/float64(b.N), "checks/op")
}
