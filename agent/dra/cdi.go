package dra

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// The Container Device Interface spec that gives a container its lease: the
// container runtime (containerd 2, CRI-O) reads it from the CDI folder and
// applies its edits to each container that names one of its devices. The
// format is a small JSON document (github.com/cncf-tags/container-device-interface,
// specs-go); gpuletd writes the part it uses with encoding/json rather than
// take in that module and its dependencies for four structs.

// CDIKind is the CDI kind of gpulet's devices: "<vendor>/<class>".
const CDIKind = DriverName + "/claim"

// cdiVersion is the spec version written: the oldest that allows what it
// uses (0.5.0 allows the dots of the vendor gpu.gpulet.io; a runtime refuses
// a spec whose version is below what it uses), so that older runtimes read it.
const cdiVersion = "0.5.0"

type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env    []string   `json:"env,omitempty"`
	Mounts []cdiMount `json:"mounts,omitempty"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

// cdiDeviceName names the CDI device of one allocated device of a claim.
// Names of claim and device alone collide when a claim shares one device
// twice; the share id keeps them apart.
func cdiDeviceName(claimUID, device, share string) string {
	name := claimUID + "-" + device
	if share != "" {
		name += "-" + share
	}
	return name
}

// cdiSpecPath is the spec file of a claim in dir.
func cdiSpecPath(dir, claimUID string) string {
	return filepath.Join(dir, DriverName+"-"+claimUID+".json")
}

// containerEdits is what a container gets for lease l: the lease's
// environment as gpurun gives it, its id, the GPUs for the NVIDIA container
// runtime, and the MPS pipe folder mounted at the same path, where the
// environment says it is.
func containerEdits(l api.Lease) cdiEdits {
	env := make(map[string]string, len(l.Env)+2)
	for k, v := range l.Env {
		env[k] = v
	}
	env[pipefile.EnvLeaseID] = l.ID
	uuids := []string{l.GPU.UUID}
	if len(l.GPUs) > 0 {
		uuids = uuids[:0]
		for _, g := range l.GPUs {
			uuids = append(uuids, g.UUID)
		}
	}
	env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(uuids, ",")
	var e cdiEdits
	for k, v := range env {
		e.Env = append(e.Env, k+"="+v)
	}
	slices.Sort(e.Env)
	if dir := l.Env[pipefile.EnvPipeDirectory]; dir != "" {
		e.Mounts = append(e.Mounts, cdiMount{HostPath: dir, ContainerPath: dir, Options: []string{"rbind", "rw"}})
	}
	return e
}

// writeCDISpec writes the spec of a claim's devices, atomically: a runtime
// reading the folder sees the old file or the new one.
func writeCDISpec(dir, claimUID string, devices []cdiDevice) error {
	b, err := json.Marshal(cdiSpec{Version: cdiVersion, Kind: CDIKind, Devices: devices})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("CDI folder: %w", err)
	}
	path := cdiSpecPath(dir, claimUID)
	tmp, err := os.CreateTemp(dir, ".tmp-"+DriverName+"-*")
	if err != nil {
		return fmt.Errorf("CDI spec: %w", err)
	}
	_, werr := tmp.Write(b)
	if err := tmp.Chmod(0o644); err != nil && werr == nil {
		werr = err
	}
	if err := tmp.Close(); err != nil && werr == nil {
		werr = err
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("CDI spec %s: %w", path, werr)
	}
	return nil
}

// removeCDISpec removes a claim's spec; one already gone is no error.
func removeCDISpec(dir, claimUID string) error {
	if err := os.Remove(cdiSpecPath(dir, claimUID)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("CDI spec: %w", err)
	}
	return nil
}
