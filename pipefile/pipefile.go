// Package pipefile is the pipe-file contract of docs/design.md §5, the part of
// it that gpuletd's ledger and offline claimers (gpurun --offline) must agree
// on: where the ledger lives, the unit names, layout.json, the claim protocol,
// and the environment a claim runs with and its arithmetic. Which GPU a
// request's gpu and type name is the API's meaning (api.MatchGPU,
// api.MatchType), shared by both sides.
//
// It owns no state and watches nothing: gpuletd's ledger (agent/ledger) keeps
// the folders and counts what is in them, and internal/offline claims. It
// depends on the standard library and golang.org/x/sys only, so that gpurun
// carries none of the daemon.
package pipefile

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultRunDir is gpuletd's run dir unless told otherwise.
const DefaultRunDir = "/run/gpulet"

// UnitsDir is the ledger's folder under the run dir.
const UnitsDir = "units"

// Variables of a claim's or a lease's environment.
const (
	EnvVisibleDevices   = "CUDA_VISIBLE_DEVICES"
	EnvThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvPinnedMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvPipeDirectory    = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDirectory     = "CUDA_MPS_LOG_DIRECTORY"
	// EnvLeaseID names the lease a command runs under ("offline" for a claim).
	EnvLeaseID = "GPULET_LEASE_ID"
	// EnvRunDir points offline tools at gpuletd's run dir.
	EnvRunDir = "GPULET_RUN_DIR"
)

// RunDir is the run dir an offline tool uses: flag when set, else
// GPULET_RUN_DIR, else DefaultRunDir.
func RunDir(flag string) string {
	if flag != "" {
		return flag
	}
	if d := os.Getenv(EnvRunDir); d != "" {
		return d
	}
	return DefaultRunDir
}

// UnitsRoot is <runDir>/units.
func UnitsRoot(runDir string) string { return filepath.Join(runDir, UnitsDir) }

// InstanceDir is the folder of instance k of the GPU uuid.
func InstanceDir(runDir, uuid string, k int) string {
	return filepath.Join(runDir, UnitsDir, uuid, strconv.Itoa(k))
}

// UnitPrefix starts every unit FIFO's name.
const UnitPrefix = "unit-"

// MaxUnits bounds a GPU's units: no GPU has a billion, and the bound keeps
// unit names short and their arithmetic far from overflow.
const MaxUnits = 999_999_999

// maxUnitDigits is the digits of MaxUnits.
const maxUnitDigits = 9

// UnitName is the FIFO name of unit i.
func UnitName(i int) string { return UnitPrefix + strconv.Itoa(i) }

// ParseUnitName returns i for a name "unit-<i>" with 0 ≤ i < total. Leading
// zeros, signs and spaces are refused so that one unit has exactly one name.
func ParseUnitName(name string, total int) (int, bool) {
	digits, ok := strings.CutPrefix(name, UnitPrefix)
	if !ok || digits == "" || len(digits) > maxUnitDigits {
		return 0, false
	}
	if digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	i := 0
	for j := 0; j < len(digits); j++ {
		c := digits[j]
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	if i >= total {
		return 0, false
	}
	return i, true
}
