package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// A request that cannot be placed now fails with an error that matches
// client.ErrInsufficientUnits; its message says what is free. Here a stand-in
// for gpuletd answers on a socket of its own, as gpuletd does on a full node.
func ExampleClient_Lease_insufficientUnits() {
	dir, err := os.MkdirTemp("", "gpulet-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "gpulet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Println(err)
		return
	}
	full := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":{"code":"insufficient_units","message":"no GPU can take 2 unit(s) now (0 free on the node)"}}`)
	})
	srv := &http.Server{Handler: full}
	go srv.Serve(ln)
	defer srv.Close()

	c := &client.Client{Socket: sock}
	_, err = c.Lease(context.Background(), api.LeaseRequest{Units: 2})
	if errors.Is(err, client.ErrInsufficientUnits) {
		fmt.Println("try later:", err)
	}
	// Output: try later: no GPU can take 2 unit(s) now (0 free on the node)
}
