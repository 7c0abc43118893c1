package pipefile

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// ThreadPercentage is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for n of a GPU's
// total units: ceil(100·n/total), so that one unit never gets 0%.
func ThreadPercentage(n, total int) int {
	return (100*n + total - 1) / total
}

// MemoryShareMiB is n of total units' share of memMiB MiB, rounded down.
func MemoryShareMiB(n, total int, memMiB uint64) uint64 {
	return memMiB * uint64(n) / uint64(total)
}

// ScaleEnv turns layout.json's one-unit environment of an instance into that
// of n of the GPU's total units: the thread percentage becomes
// ThreadPercentage(n, total), as gpuletd gives a lease, and a pinned memory
// limit is multiplied by n. CUDA_VISIBLE_DEVICES is the GPU's UUID where the
// layout does not say.
func ScaleEnv(env map[string]string, uuid string, n, total int) (map[string]string, error) {
	if n < 1 || total < 1 {
		return nil, fmt.Errorf("cannot scale an environment to %d of %d units", n, total)
	}
	out := make(map[string]string, len(env)+2)
	for k, v := range env {
		out[k] = v
	}
	if out[EnvVisibleDevices] == "" {
		out[EnvVisibleDevices] = uuid
	}
	out[EnvThreadPercentage] = strconv.Itoa(ThreadPercentage(n, total))
	if v, ok := env[EnvPinnedMemLimit]; ok {
		scaled, err := ScaleMemLimit(v, n)
		if err != nil {
			return nil, err
		}
		out[EnvPinnedMemLimit] = scaled
	}
	return out, nil
}

// ScaleMemLimit multiplies every limit of a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// value ("0=5120M", or "0=1G,1=512M") by n, keeping each limit's unit.
func ScaleMemLimit(v string, n int) (string, error) {
	if n < 1 {
		return "", fmt.Errorf("%s: cannot scale to %d units", EnvPinnedMemLimit, n)
	}
	bad := fmt.Errorf("%s %q: want DEVICE=SIZE entries such as 0=5120M", EnvPinnedMemLimit, v)
	entries := strings.Split(v, ",")
	for i, e := range entries {
		dev, size, ok := strings.Cut(e, "=")
		if !ok || !allDigits(dev) {
			return "", bad
		}
		end := 0
		for end < len(size) && size[end] >= '0' && size[end] <= '9' {
			end++
		}
		num, err := strconv.ParseUint(size[:end], 10, 64)
		if err != nil || !allLetters(size[end:]) {
			return "", bad
		}
		hi, scaled := bits.Mul64(num, uint64(n))
		if hi != 0 {
			return "", fmt.Errorf("%s %q: %d times it is too large", EnvPinnedMemLimit, v, n)
		}
		entries[i] = dev + "=" + strconv.FormatUint(scaled, 10) + size[end:]
	}
	return strings.Join(entries, ","), nil
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func allLetters(s string) bool {
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') {
			return false
		}
	}
	return true
}
