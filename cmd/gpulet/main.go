// Command gpulet shows and manages the node's GPU units through gpuletd. See
// internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpulet/gpulet/internal/cli"
)

func main() {
	// Caught first, so that Ctrl-C ends `gpulet top` (or a slow request)
	// through its context, with a clean exit.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := cli.Run(ctx, cli.HookArgs(os.Args[0], os.Args[1:]), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
