// Command gpurun runs a command on GPU units leased from gpuletd, in its own
// process (exec), so that the lease lives as long as the command. See
// internal/gpurun, which also catches Ctrl-C while it waits for units.
package main

import (
	"context"
	"os"

	"github.com/gpulet/gpulet/internal/gpurun"
)

func main() {
	os.Exit(gpurun.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
