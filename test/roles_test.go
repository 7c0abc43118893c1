package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// helperRoleEnv makes the test binary act as a separate process in a test
// instead of running tests.
const helperRoleEnv = "GPULET_E2E_ROLE"

func runHelperRole(role string) int {
	switch role {
	case "claim":
		return claimRole()
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// claimRole claims one unit offline by DESIGN section 5's protocol, on the GPU
// and instance of GPULET_E2E_GPU (index), prints the unit and holds the claim
// until killed.
func claimRole() int {
	runDir := os.Getenv("GPULET_RUN_DIR")
	gi, _ := strconv.Atoi(os.Getenv("GPULET_E2E_GPU"))
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
