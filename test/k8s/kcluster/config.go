package kcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Paths of containerd's state, derived from the cluster's folders.
const (
	containerdRoot   = StateDir + "/containerd"
	containerdState  = RunDir + "/containerd"
	containerdSocket = containerdState + "/containerd.sock"
)

// containerdConfig is containerd's config in its version-2 form, which
// containerd 2 reads and migrates.
//   - restrict_oom_score_adj: where root lacks CAP_SYS_RESOURCE, runc cannot
//     lower the sandbox's oom_score_adj and fails ("can't get final child's
//     PID from pipe"); clamping it to containerd's own always works.
//   - a loopback-only CNI network: pods use the host's network, but the CRI
//     reports the node's network ready only once a CNI config exists.
//   - CDI from CDIDir alone, so that what drivers write goes with the cluster.
//   - no NRI: its socket would be the host's /run/nri.
func containerdConfig(pauseRef, cniConf, runc string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[debug]
  address = "%[2]s/debug.sock"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  stream_server_address = "127.0.0.1"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = [%[5]q]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "%[2]s/runc"
        BinaryName = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`, containerdRoot, containerdState, containerdSocket, pauseRef, CDIDir, runc, cniConf)
}

const cniLoopback = `{"cniVersion": "1.0.0", "name": "gpulet-test-lo", "plugins": [{"type": "loopback"}]}` + "\n"

// kubeletConfig is the KubeletConfiguration. Its choices, and why:
//   - failCgroupV1 false: 1.35 and later refuse cgroup v1 hosts by default.
//   - cgroupRoot: pods' cgroups apart from any other kubelet's.
//   - low eviction thresholds and no image GC: a test machine's disk is
//     often fuller than a node's defaults allow.
//   - no iptables chains: there is no pod network and no kube-proxy.
func kubeletConfig(pki string, port, healthzPort int, gates map[string]bool) string {
	var fg strings.Builder
	if len(gates) > 0 {
		fg.WriteString("featureGates:\n")
		for _, k := range sortedKeys(gates) {
			fmt.Fprintf(&fg, "  %s: %t\n", k, gates[k])
		}
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %[2]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
tlsCertFile: %[1]s/kubelet-serving.crt
tlsPrivateKeyFile: %[1]s/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[1]s/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%[4]s
cgroupDriver: cgroupfs
cgroupRoot: /%[5]s
failSwapOn: false
failCgroupV1: false
makeIPTablesUtilChains: false
maxPods: 60
podLogsDir: %[6]s
resolvConf: /etc/resolv.conf
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%%", "imagefs.available": "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
%[7]s`, pki, port, healthzPort, containerdSocket, CgroupRoot, podLogsDir, fg.String())
}

// kubeconfig is a kubeconfig for one client certificate of the PKI.
func kubeconfig(server, pki, cert string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: gpulet-test
  cluster:
    server: %[1]s
    certificate-authority: %[2]s/ca.crt
users:
- name: %[3]s
  user:
    client-certificate: %[2]s/%[3]s.crt
    client-key: %[2]s/%[3]s.key
contexts:
- name: gpulet-test
  context: {cluster: gpulet-test, user: %[3]s}
current-context: gpulet-test
`, server, pki, cert)
}

// gateFlag is the --feature-gates value of the control plane's components.
func gateFlag(gates map[string]bool) string {
	parts := make([]string, 0, len(gates))
	for _, k := range sortedKeys(gates) {
		parts = append(parts, fmt.Sprintf("%s=%t", k, gates[k]))
	}
	return strings.Join(parts, ",")
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func writeFiles(files map[string]string) error {
	for p, s := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			return err
		}
	}
	return nil
}
