package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// Lease two units for ten minutes, run a program with the lease's
// environment, and give the units back. A program that runs for as long as its
// own process should leave out TTL: the lease is then bound to the caller's pid
// and ends by itself when the process exits.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var c client.Client // GPULET_SOCKET, or /run/gpulet/gpulet.sock
	l, err := c.Lease(ctx, api.LeaseRequest{Units: 2, Type: "A100", TTL: "10m", Wait: "30s"})
	switch {
	case errors.Is(err, client.ErrInsufficientUnits):
		fmt.Println("no units free within 30s:", err)
		return
	case errors.Is(err, client.ErrNoDaemon):
		fmt.Println("gpuletd is not running:", err)
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer c.Release(context.Background(), l.ID)

	cmd := exec.CommandContext(ctx, "python3", "infer.py")
	cmd.Env = os.Environ()
	for k, v := range l.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if err := cmd.Run(); err != nil {
		fmt.Println(err)
	}
}

// Read the node's free units, as a scheduler polling the node would.
func ExampleClient_Snapshot() {
	c := &client.Client{Socket: "/run/gpulet/gpulet.sock"}
	s, err := c.Snapshot(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, g := range s.GPUs {
		fmt.Printf("GPU %d %s: %d of %d units free, eligible %v\n", g.Index, g.Name, g.UnitsFree, g.UnitsTotal, g.Eligible)
	}
}
