package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// helperRoleEnv makes the test binary act as a separate process in a test
// instead of running tests.
const helperRoleEnv = "GPULET_E2E_ROLE"

func runHelperRole(role string) int {
	switch role {
	case "claim":
		return claimRole()
	case "user":
		return userRole()
	case "bound":
		return boundRole()
	case "intrude":
		return intrudeRole()
	case "connector":
		return connectorRole()
	case "holder":
		return holderRole()
	case "request":
		return requestRole()
	case "block":
		return blockRole()
	case "hog":
		return hogRole()
	case "waiters":
		return waitersRole()
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// claimRole claims one unit offline by docs/design.md §5's protocol, on the GPU
// of GPULET_E2E_GPU (index) and its first instance with room, or the instance
// GPULET_E2E_INSTANCE where set, prints the unit and holds the claim until
// killed.
func claimRole() int {
	runDir := os.Getenv("GPULET_RUN_DIR")
	gi, _ := strconv.Atoi(os.Getenv("GPULET_E2E_GPU"))
	only, err := strconv.Atoi(os.Getenv("GPULET_E2E_INSTANCE"))
	if err != nil {
		only = -1
	}
	b, err := os.ReadFile(filepath.Join(runDir, "units", "layout.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var lay struct {
		GPUs []struct {
			UUID      string `json:"uuid"`
			Instances []struct {
				Instance int   `json:"instance"`
				Units    []int `json:"units"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(b, &lay); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g := lay.GPUs[gi]
	for _, in := range g.Instances {
		if only >= 0 && in.Instance != only {
			continue
		}
		dir := filepath.Join(runDir, "units", g.UUID, strconv.Itoa(in.Instance))
		tmp := filepath.Join(dir, fmt.Sprintf(".claim-%d", os.Getpid()))
		if err := unix.Mkfifo(tmp, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, u := range in.Units {
			if unix.Link(tmp, filepath.Join(dir, "unit-"+strconv.Itoa(u))) == nil {
				unix.Unlink(tmp)
				fmt.Println(u)
				select {}
			}
		}
		unix.Unlink(tmp)
		unix.Close(fd)
	}
	fmt.Fprintln(os.Stderr, "no free unit")
	return 1
}

// userRole runs as an ordinary user against GPULET_SOCKET and prints, one per
// line, what each call gave: its own lease, what it can list, and whether it
// could touch the lease GPULET_E2E_OTHER_LEASE or the simulation controls.
func userRole() int {
	ctx := context.Background()
	var c client.Client
	code := func(err error) string {
		if err == nil {
			return "ok"
		}
		for _, e := range []error{client.ErrNotFound, client.ErrForbidden} {
			if errors.Is(err, e) {
				return e.Error()
			}
		}
		return "error: " + err.Error()
	}
	own, err := c.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		fmt.Println("lease=" + code(err))
		return 1
	}
	fmt.Printf("lease=ok uid=%d\n", own.Owner.UID)
	leases, err := c.Leases(ctx)
	fmt.Printf("list=%s count=%d\n", code(err), len(leases))
	other := os.Getenv("GPULET_E2E_OTHER_LEASE")
	_, err = c.GetLease(ctx, other)
	fmt.Println("get-other=" + code(err))
	fmt.Println("release-other=" + code(c.Release(ctx, other)))
	u := 50
	_, err = c.SetSimGPU(ctx, 0, api.SimGPUUpdate{UtilizationPct: &u})
	fmt.Println("sim=" + code(err))
	_, err = c.Drain(ctx)
	fmt.Println("drain=" + code(err))
	fmt.Println("release-own=" + code(c.Release(ctx, own.ID)))
	return 0
}

// intrudeRole tries to put an entry of every kind at unit names of the
// instance folder GPULET_E2E_DIR, and to list it, and prints what each try
// gave, one per line.
func intrudeRole() int {
	dir := os.Getenv("GPULET_E2E_DIR")
	result := func(err error) string {
		if err == nil {
			return "ok"
		}
		var errno unix.Errno
		if errors.As(err, &errno) {
			return errno.Error()
		}
		return err.Error()
	}
	at := func(name string) string { return filepath.Join(dir, name) }
	fmt.Println("fifo=" + result(unix.Mkfifo(at("unit-0"), 0o600)))
	fd, err := unix.Open(at("unit-1"), unix.O_CREAT|unix.O_WRONLY, 0o644)
	if err == nil {
		unix.Close(fd)
	}
	fmt.Println("file=" + result(err))
	fmt.Println("symlink=" + result(unix.Symlink("/etc/shadow", at("unit-2"))))
	fmt.Println("folder=" + result(unix.Mkdir(at("unit-3"), 0o755)))
	fmt.Println("temp=" + result(unix.Mkfifo(at(".claim-x"), 0o600)))
	_, err = os.ReadDir(dir)
	fmt.Println("list=" + result(err))
	return 0
}

// boundRole asks gpuletd at GPULET_SOCKET for three one-unit leases bound to
// its own process, then one bound to time, and prints what each gave, one per
// line.
func boundRole() int {
	ctx := context.Background()
	var c client.Client
	for i := range 3 {
		_, err := c.Lease(ctx, api.LeaseRequest{Units: 1})
		fmt.Printf("bound%d=%s\n", i, outcome(err))
	}
	_, err := c.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"})
	fmt.Printf("ttl=%s\n", outcome(err))
	return 0
}

// outcome is "ok" or the API's error code of err.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	_, code := api.StatusOf(err)
	return code
}
