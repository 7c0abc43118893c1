// Command gpuletd is gpulet's per-host daemon. See agent.Run.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent"
	"github.com/gpulet/gpulet/internal/logwriter"
	"github.com/gpulet/gpulet/internal/version"
)

// gcPercent is the garbage collector's pace unless GOGC is set. The daemon's
// heap is small and nearly everything it allocates is the garbage of answered
// requests, so the default pace (100) spends CPU that leasing needs: at 400 a
// lease and its release under churn cost about 5% less CPU, for a resident
// set nearly twice as large with many leases held (80-90 MB against 46 with
// 10,240 leases; 22 MB idle either way: section 18 of
// docs/benchmarks/memory-and-slurm.md).
const gcPercent = 400

// memoryFloor is the least soft memory limit gpuletd keeps unless GOMEMLIMIT
// is set; it rises with the live heap (memlimit.For). At GOGC 400 alone, each
// byte a held lease keeps costs about five of resident set; with the floor,
// gpuletd holding 10,240 leases stays near 45 MB instead of 80, while churn
// on a few leases, whose heap stays far below it, keeps the slower pace.
const memoryFloor = 32 << 20

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	if len(os.Args) > 1 && os.Args[1] == agent.ViewProcessArg {
		os.Exit(agent.RunViewProcess(os.Args[2:], slog.New(slog.NewTextHandler(os.Stderr, nil))))
	}
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, "gpuletd")
		return
	}
	// Signals are caught before the slow start-up, so that a SIGTERM during it
	// still stops cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Usage asked for goes to stdout, so that it pages; what a bad flag
	// prints, to stderr.
	var usage bytes.Buffer
	cfg, err := agent.ParseFlags(os.Args[1:], &usage)
	if errors.Is(err, agent.ErrHelp) {
		os.Stdout.Write(usage.Bytes())
		return
	}
	os.Stderr.Write(usage.Bytes())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuletd:", err)
		os.Exit(2)
	}
	logs := logwriter.New(os.Stderr)
	cfg.Logger = slog.New(logwriter.FlushingHandler(slog.NewTextHandler(logs, nil), logs, slog.LevelWarn))
	cfg.NVML = nvml.New()
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		cfg.MemoryFloor = memoryFloor
	}
	err = agent.Run(ctx, cfg)
	logs.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuletd:", err)
		os.Exit(1)
	}
}
