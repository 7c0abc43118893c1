// Package k8s tests gpulet on a real single-node Kubernetes that TestMain
// starts once for the package (kcluster) and stops at the end, also when a
// test fails or the run is interrupted. The Kubernetes binaries come from
// build.sh, which builds them once per version into a cache outside the
// clone.
package k8s

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/test/e2e"
	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// Versions of the cluster; build.sh has the same defaults, and
// docs/kubernetes.md says why these.
const (
	k8sVersion        = "v1.37.2"
	containerdVersion = "v2.2.9"
)

// Images the tests run, imported into the cluster without a registry.
const (
	pauseRef   = "localhost/gpulet-test/pause:1"
	probeRef   = "localhost/gpulet-test/probe:1"
	gpuletdRef = "localhost/gpulet/gpuletd:test"
)

// featureGates the cluster sets on every component: what the DRA driver
// relies on. In 1.37 both are beta and on by default; set anyway, so that
// the cluster is what the driver needs whatever a version's defaults.
var featureGates = map[string]bool{"DRAConsumableCapacity": true, "DRADeviceBindingConditions": true}

var (
	// cluster is the package's cluster; nil when skipReason is set.
	cluster *kcluster.Cluster
	// skipReason says why no cluster can run on this machine.
	skipReason string
	// processStart is when the test binary started: go test's -timeout
	// counts from then.
	processStart = time.Now()
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getuid() != 0 {
		skipReason = fmt.Sprintf("a real kubelet needs root; runs as uid %d", os.Getuid())
		return m.Run()
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		skipReason = "no cgroup filesystem at /sys/fs/cgroup, which the kubelet needs"
		return m.Run()
	}
	bin, err := buildKubernetes()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/k8s:", err)
		return 1
	}
	cleanupBins, err := e2e.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/k8s:", err)
		return 1
	}
	defer cleanupBins()
	imgDir, err := os.MkdirTemp("", "gpulet-k8s-images-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// the archives are needed until imported, but removed however run ends
	defer os.RemoveAll(imgDir)
	images, err := buildImages(imgDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/k8s: building images:", err)
		return 1
	}
	logDir, err := os.MkdirTemp("", "gpulet-k8s-logs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	c, err := kcluster.Start(ctx, kcluster.Options{
		Bin: bin, PauseImage: images[pauseRef], PauseRef: pauseRef,
		FeatureGates: featureGates, Log: os.Stderr, LogDir: logDir,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "test/k8s: the cluster did not come up (component logs in %s): %v\n", logDir, err)
		return 1
	}
	cluster = c
	// Stop the cluster on SIGINT or SIGTERM, and before go test's -timeout
	// ends the process without running any deferred function.
	stopped := make(chan struct{})
	go func() {
		var deadline <-chan time.Time
		if f := flag.Lookup("test.timeout"); f != nil {
			if d, err := time.ParseDuration(f.Value.String()); err == nil && d > time.Minute {
				deadline = time.After(d - time.Since(processStart) - 45*time.Second)
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "test/k8s: interrupted: stopping the cluster")
		case <-deadline:
			fmt.Fprintln(os.Stderr, "test/k8s: the test timeout is near: stopping the cluster")
		case <-stopped:
			return
		}
		c.Stop()
		// os.Exit runs no deferred function: remove what they would
		cleanupBins()
		os.RemoveAll(imgDir)
		fmt.Fprintln(os.Stderr, "test/k8s: the cluster's component logs are in", logDir)
		os.Exit(1)
	}()
	for ref, archive := range images {
		if ref == pauseRef {
			continue
		}
		if err := c.ImportImage(archive); err != nil {
			fmt.Fprintln(os.Stderr, "test/k8s:", err)
			close(stopped)
			c.Stop()
			return 1
		}
	}
	os.RemoveAll(imgDir)

	code := m.Run()
	close(stopped)
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "test/k8s: stopping the cluster:", err)
		code = 1
	}
	if err := c.CheckRestored(); err != nil {
		fmt.Fprintln(os.Stderr, "test/k8s: the host is not as before the cluster:", err)
		code = 1
	}
	if code == 0 {
		os.RemoveAll(logDir)
	} else {
		fmt.Fprintln(os.Stderr, "test/k8s: the cluster's component logs are in", logDir)
	}
	return code
}

// buildKubernetes runs build.sh, which builds the binaries once per
// version into a cache outside the clone, and returns their folder.
func buildKubernetes() (string, error) {
	fmt.Fprintf(os.Stderr, "test/k8s: Kubernetes %s and containerd %s from build.sh (a machine's first build takes 10-35 min and about 3 GB of Go build cache; later runs reuse it)\n", k8sVersion, containerdVersion)
	cmd := exec.Command("./build.sh")
	cmd.Env = append(os.Environ(), "K8S_VERSION="+k8sVersion, "CONTAINERD_VERSION="+containerdVersion)
	cmd.Stderr = os.Stderr
	// a test binary killed by its -timeout takes the build (or its wait
	// for another one) with it
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build.sh failed: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// need skips a test where no cluster can run here, saying why.
func need(t testing.TB) *kcluster.Cluster {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	return cluster
}

// testCtx ends with the test, or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// goBuild builds a static binary of a package of this module into dir.
func goBuild(dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = e2e.ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}
