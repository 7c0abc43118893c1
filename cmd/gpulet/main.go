// Command gpulet shows and manages the node's GPU units through gpuletd. See
// internal/cli.
package main

import (
	"os"

	"github.com/gpulet/gpulet/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
