// Command gpurun runs a command on GPU units leased from gpuletd. See
// internal/gpurun.
package main

import (
	"os"

	"github.com/gpulet/gpulet/internal/gpurun"
)

func main() { os.Exit(gpurun.Main(os.Args[1:], os.Stderr)) }
