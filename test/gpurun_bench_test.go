package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// wrapperSource is the least a lease-and-exec wrapper can do: one POST
// /v1/leases on the socket with net/http, the lease's env, exec. It is the
// floor gpurun is measured against.
const wrapperSource = `package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

func main() {
	sock := os.Getenv("GPULET_SOCKET")
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		os.Exit(127)
	}
	resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(` + "`" + `{"units":1}` + "`" + `))
	if err != nil {
		os.Exit(125)
	}
	var l struct {
		ID  string            ` + "`" + `json:"id"` + "`" + `
		Env map[string]string ` + "`" + `json:"env"` + "`" + `
	}
	err = json.NewDecoder(resp.Body).Decode(&l)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		os.Exit(125)
	}
	env := append(os.Environ(), "GPULET_LEASE_ID="+l.ID)
	for k, v := range l.Env {
		env = append(env, k+"="+v)
	}
	syscall.Exec(path, os.Args[1:], env)
	os.Exit(126)
}
`

// buildWrapper builds wrapperSource as its own module, without cgo like
// gpurun.
func buildWrapper(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module wrapper\n\ngo 1.26\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(wrapperSource), 0o644); err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(dir, "wrapper")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building the wrapper: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkGpurunTrue measures starting `true` directly, through the minimal
// wrapper, and through gpurun; gpurun's cost over the wrapper is its own.
func BenchmarkGpurunTrue(b *testing.B) {
	// 8 GPUs of 64 units: leases of exited processes end asynchronously, and
	// must never run the node out of units.
	d := e2e.Start(b, "--sim-gpus", "8xA100-80GB", "--clients-per-instance", "64")
	wrapper := buildWrapper(b)
	env := append(os.Environ(), "GPULET_SOCKET="+d.Socket)
	for _, bc := range []struct {
		name string
		argv []string
	}{
		{"direct", []string{"true"}},
		{"wrapper", []string{wrapper, "true"}},
		{"gpurun", []string{e2e.Bin("gpurun"), "--units", "1", "--", "true"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(bc.argv[0], bc.argv[1:]...)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%s: %v\n%s", bc.name, err, out)
				}
			}
		})
	}
}
