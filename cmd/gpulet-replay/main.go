// Command gpulet-replay replays a cluster trace through gpulet's placement.
// See package replay and docs/replay.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpulet/gpulet/internal/version"
	"github.com/gpulet/gpulet/replay"
)

func main() {
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, "gpulet-replay")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := replay.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
