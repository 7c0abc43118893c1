// Command gpulet-collector keeps one resource table of the nodes that push
// their snapshots to it. See package collector.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpulet/gpulet/collector"
	"github.com/gpulet/gpulet/internal/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, "gpulet-collector")
		return
	}
	// Signals are caught first, so that a SIGTERM at any time stops cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := collector.ParseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, collector.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := collector.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "gpulet-collector:", err)
		os.Exit(1)
	}
}
