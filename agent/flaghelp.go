package agent

import "github.com/gpulet/gpulet/internal/flaghelp"

// gpuletdFlagGroups are gpuletd's flags as --help and the flag table of
// docs/gpuletd.md list them: the same headings, the same flags under each,
// in the same order (flagtable_test.go holds all three to one another).
var gpuletdFlagGroups = []flaghelp.Group{
	{Title: "Socket and state", Flags: []string{"socket", "socket-group", "run-dir", "state-dir", "mount"}},
	{Title: "GPUs", Flags: []string{"backend", "sim-gpus"}},
	{Title: "Units (M×N×K, U)", Flags: []string{"units-per-client", "clients-per-instance", "instances-per-gpu", "units-per-gpu"}},
	{Title: "Placement and sampling", Flags: []string{"max-utilization", "policy", "sample-interval", "accounting"}},
	{Title: "Node, admins and config", Flags: []string{"node-name", "admin-group", "private-leases", "config"}},
	{Title: "Pushing to upstreams", Flags: []string{"upstream", "report-interval", "upstream-token-file", "upstream-cert", "upstream-key", "upstream-ca"}},
	{Title: "Read-only TCP endpoint", Flags: []string{"listen", "listen-full-detail", "listen-max-conns", "listen-max-conns-per-addr"}},
	{Title: "Limits per uid", Flags: []string{"max-conns-per-uid", "max-waiters-per-uid"}},
	{Title: "MPS", Flags: []string{"mps", "mps-control"}},
	{Title: "Reservations", Flags: []string{"reclaim-grace"}},
	{Title: "Kubernetes", Flags: []string{"kubelet-plugin", "kubelet-dir", "pod-resources-socket", "pod-resources-interval", "dra", "dra-kubeconfig", "dra-kubelet-dir", "cdi-dir"}},
}

// gpuletdComputedDefaults are the defaults worked out at start, which the
// flag's own zero value stands for: --help shows them in words.
var gpuletdComputedDefaults = map[string]string{
	"mount":            "<run-dir>/view",
	"units-per-client": "U",
	"units-per-gpu":    "16",
}
