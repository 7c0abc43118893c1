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
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulet/gpulet/agent"
	"github.com/gpulet/gpulet/internal/logwriter"
)

func main() {
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
	err = agent.Run(ctx, cfg)
	logs.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuletd:", err)
		os.Exit(1)
	}
}
