package inventory

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Model is a GPU model the simulated backend can present, with the figures the
// real card reports through NVML, so that configs written on a simulated node work
// unchanged on a real one.
type Model struct {
	Key               string // as written in --sim-gpus, e.g. "A100-80GB"
	Name              string // NVML product name
	MemoryTotalMiB    uint64
	CCMajor, CCMinor  int
	Cores             int
	MaxSMClockMHz     int
	MemoryBusWidthBit int
	MemoryClockMHz    int
}

// Models are the simulated backend's models, from the cards' public data sheets.
var Models = []Model{
	{"T4-16GB", "Tesla T4", 15360, 7, 5, 2560, 1590, 256, 5001},
	{"V100-32GB", "Tesla V100-SXM2-32GB", 32768, 7, 0, 5120, 1530, 4096, 877},
	{"A10-24GB", "NVIDIA A10", 23028, 8, 6, 9216, 1695, 384, 6251},
	{"L4-24GB", "NVIDIA L4", 23034, 8, 9, 7424, 2040, 192, 6251},
	{"A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 8, 0, 6912, 1410, 5120, 1215},
	{"A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 8, 0, 6912, 1410, 5120, 1593},
	{"H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 9, 0, 16896, 1980, 5120, 2619},
}

// maxSimGPUs bounds a spec so that a typo such as 1000xT4 fails clearly.
const maxSimGPUs = 64

// ModelKeys lists the accepted model names of --sim-gpus.
func ModelKeys() []string {
	keys := make([]string, 0, len(Models))
	for _, m := range Models {
		keys = append(keys, m.Key)
	}
	return keys
}

func findModel(key string) (Model, bool) {
	m, found := matchModels(key)
	if len(found) == 1 {
		return found[0], true
	}
	return m, false
}

// matchModels finds the models a key names: the one of that exact key, or
// those whose key without the memory suffix it is.
func matchModels(key string) (Model, []Model) {
	for _, m := range Models {
		if strings.EqualFold(m.Key, key) {
			return m, []Model{m}
		}
	}
	// The memory suffix may be left out where only one size exists (T4, A10, ...).
	var found []Model
	for _, m := range Models {
		short, _, _ := strings.Cut(m.Key, "-")
		if strings.EqualFold(short, key) {
			found = append(found, m)
		}
	}
	return Model{}, found
}

// ParseSimSpec parses a --sim-gpus value: comma-separated COUNTxMODEL items (the
// COUNTx part may be left out for one GPU), e.g. "2xA100-80GB,1xT4-16GB".
func ParseSimSpec(spec string) ([]Model, error) {
	usage := fmt.Sprintf("accepted forms: COUNTxMODEL[,COUNTxMODEL...] such as 2xA100-80GB,1xT4-16GB; models: %s",
		strings.Join(ModelKeys(), ", "))
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("--sim-gpus is empty; %s", usage)
	}
	var out []Model
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		count, key := 1, item
		if n, rest, ok := strings.Cut(item, "x"); ok && n != "" && isDigits(n) {
			c, err := strconv.Atoi(n)
			if err != nil || c < 1 {
				return nil, fmt.Errorf("--sim-gpus item %q: count must be a whole number of at least 1; %s", item, usage)
			}
			count, key = c, rest
		}
		m, ok := findModel(key)
		if !ok {
			if _, found := matchModels(key); len(found) > 1 {
				keys := make([]string, len(found))
				for i, f := range found {
					keys[i] = f.Key
				}
				return nil, fmt.Errorf("--sim-gpus item %q: model %q is ambiguous: say which of %s; %s", item, key, strings.Join(keys, ", "), usage)
			}
			return nil, fmt.Errorf("--sim-gpus item %q: unknown model %q; %s", item, key, usage)
		}
		if count > maxSimGPUs || len(out)+count > maxSimGPUs {
			return nil, fmt.Errorf("--sim-gpus %q: more than %d GPUs; %s", spec, maxSimGPUs, usage)
		}
		for i := 0; i < count; i++ {
			out = append(out, m)
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// SimUUID is the stable UUID of simulated GPU index on node: a restarted daemon
// sees the same GPUs, and two simulated nodes never share one.
func SimUUID(node string, index int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("gpulet-sim/%s/%d", node, index)))
	x := fmt.Sprintf("%x", h[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// OnFault never calls f: a simulated GPU fails when Set latches an Xid, and
// the agent samples after each Set.
func (s *Sim) OnFault(func()) {}

// ComputeMode is DEFAULT: a simulated GPU admits any number of processes.
func (s *Sim) ComputeMode(int) (nvml.ComputeMode, error) { return nvml.COMPUTEMODE_DEFAULT, nil }

// Simulator is the backend itself.
func (s *Sim) Simulator() Simulator { return s }
