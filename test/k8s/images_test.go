package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
	"github.com/gpulet/gpulet/test/k8s/kcluster"
)

// mpsControl is the MPS control daemon the test image holds when the host
// has it.
const mpsControl = "nvidia-cuda-mps-control"

// What gpuletd's image holds in /usr/local/bin, and runs.
var (
	imageBinaries   = []string{"gpuletd", "gpulet", "gpurun"}
	imageEntrypoint = "/usr/local/bin/gpuletd"
)

// gpuletdImage is gpuletd's image as deploy/kubernetes/Dockerfile makes
// it, from the binaries this run built: gpuletd, gpulet and gpurun in
// /usr/local/bin. Docker's debian:bookworm-slim base is not at hand
// without a registry, so the base layer holds what gpuletd needs of it: the
// shared libraries ldd names, /etc/passwd and /etc/group with root, and
// /tmp.
func gpuletdImage() (kcluster.Image, error) {
	base, err := kcluster.SharedLibraries(e2e.Bin("gpuletd"))
	if err != nil {
		return kcluster.Image{}, err
	}
	base = append(base,
		kcluster.File{Name: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\n"), Mode: 0o644},
		kcluster.File{Name: "/etc/group", Data: []byte("root:x:0:\n"), Mode: 0o644},
		kcluster.File{Name: "/tmp", Mode: 0o777 | os.ModeSticky},
	)
	var bins kcluster.Layer
	for _, b := range imageBinaries {
		bins = append(bins, kcluster.File{Name: "/usr/local/bin/" + b, Src: e2e.Bin(b), Mode: 0o755})
	}
	layers := []kcluster.Layer{base, bins}
	// What the NVIDIA container runtime would give the container: the
	// driver's MPS control daemon (here the real one of Debian's
	// nvidia-cuda-mps), so that gpuletd runs its instances under MPS.
	if mps, err := exec.LookPath(mpsControl); err == nil {
		driver, err := kcluster.SharedLibraries(mps)
		if err != nil {
			return kcluster.Image{}, err
		}
		layers = append(layers, append(driver, kcluster.File{Name: "/usr/bin/" + mpsControl, Src: mps, Mode: 0o755}))
	}
	return kcluster.Image{
		Ref:        gpuletdRef,
		Entrypoint: []string{imageEntrypoint},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Layers:     layers,
	}, nil
}

// buildImages writes the archives of the pause, probe and gpuletd images
// into dir, by reference.
func buildImages(dir string) (map[string]string, error) {
	pause, err := goBuild(dir, "./test/k8s/kcluster/pause")
	if err != nil {
		return nil, err
	}
	probe, err := goBuild(dir, "./test/k8s/probe")
	if err != nil {
		return nil, err
	}
	gpuletd, err := gpuletdImage()
	if err != nil {
		return nil, err
	}
	images := []kcluster.Image{
		{Ref: pauseRef, Entrypoint: []string{"/pause"}, Layers: []kcluster.Layer{{{Name: "/pause", Src: pause}}}},
		{Ref: probeRef, Entrypoint: []string{"/probe"}, Layers: []kcluster.Layer{{{Name: "/probe", Src: probe}}}},
		gpuletd,
	}
	out := map[string]string{}
	for i, img := range images {
		archive := filepath.Join(dir, []string{"pause", "probe", "gpuletd"}[i]+".tar")
		if err := kcluster.WriteArchive(archive, img); err != nil {
			return nil, err
		}
		out[img.Ref] = archive
	}
	return out, nil
}

// TestImageMatchesDockerfile holds the image the tests build to
// deploy/kubernetes/Dockerfile's final stage: the same binaries in
// /usr/local/bin and the same entrypoint.
func TestImageMatchesDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, bin := range imageBinaries {
		srcs = append(srcs, "/src/bin/"+bin)
	}
	for _, line := range []string{
		"COPY --from=build " + strings.Join(srcs, " ") + " /usr/local/bin/",
		`ENTRYPOINT ["` + imageEntrypoint + `"]`,
		"FROM debian:bookworm-slim",
	} {
		if !strings.Contains(string(b), "\n"+line+"\n") {
			t.Errorf("deploy/kubernetes/Dockerfile lacks the line %q, which the test image is built to", line)
		}
	}
}

// TestOverlayNamesTheClusterFolders holds the test overlay's host folders
// and apiserver port to kcluster's.
func TestOverlayNamesTheClusterFolders(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(overlay, "daemonset-patch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"path: " + kcluster.RunDir + "/gpulet}", "path: " + kcluster.StateDir + "/gpulet}",
		"path: " + kcluster.KubeletRoot + "/pod-resources}",
		"path: " + kcluster.KubeletRoot + "/plugins}", "path: " + kcluster.KubeletRoot + "/plugins_registry}",
		"path: " + kcluster.CDIDir + "}", fmt.Sprintf("value: \"%d\"", kcluster.APIServerPort),
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the overlay's patch lacks %q", want)
		}
	}
}
