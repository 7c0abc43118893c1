// Command probe is the container of the test cluster's probe pods. It
// prints what a device plugin or DRA driver gave it, then waits for
// SIGTERM: every environment variable whose name starts with CUDA_,
// GPULET_ or NVIDIA_, as "env NAME=VALUE", and for each path given as an
// argument, "mount PATH" and then "entry PATH/NAME" for each entry in it
// (or "missing PATH: why").
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	env := os.Environ()
	sort.Strings(env)
	for _, e := range env {
		for _, p := range []string{"CUDA_", "GPULET_", "NVIDIA_"} {
			if strings.HasPrefix(e, p) {
				fmt.Println("env", e)
			}
		}
	}
	for _, dir := range os.Args[1:] {
		entries, err := os.ReadDir(dir)
		if err != nil {
			fmt.Printf("missing %s: %v\n", dir, err)
			continue
		}
		fmt.Println("mount", dir)
		for _, e := range entries {
			fmt.Println("entry", filepath.Join(dir, e.Name()))
		}
	}
	fmt.Println("probe ready")
	<-stop
}
