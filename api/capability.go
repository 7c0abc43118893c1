package api

import (
	"fmt"
	"strconv"
	"strings"
)

// ComputeCapability is a CUDA compute capability, MAJOR.MINOR (8.0 for an
// A100, 7.5 for a T4). The zero value is "unknown": NVML did not give it, or,
// in a request, none was asked.
type ComputeCapability struct {
	Major, Minor int
}

// String writes c as MAJOR.MINOR, the way NVIDIA and nvidia-smi write it.
func (c ComputeCapability) String() string { return fmt.Sprintf("%d.%d", c.Major, c.Minor) }

// IsZero reports whether c is unknown (or not asked).
func (c ComputeCapability) IsZero() bool { return c == ComputeCapability{} }

// Less reports whether c is below o: by major, then minor.
func (c ComputeCapability) Less(o ComputeCapability) bool {
	if c.Major != o.Major {
		return c.Major < o.Major
	}
	return c.Minor < o.Minor
}

// ParseComputeCapability reads MAJOR.MINOR: a major of one or two digits
// from 1 up, a dot, and a minor of one digit (NVIDIA's minors never reach 10:
// 8.9 is followed by 9.0). Nothing else is accepted: no spaces, signs or
// exponents, so that "8" or "8.0.1" is refused rather than guessed at. The
// error does not name the field; the caller adds it.
func ParseComputeCapability(s string) (ComputeCapability, error) {
	major, minor, ok := strings.Cut(s, ".")
	if !ok || !digits(major, 1, 2) || !digits(minor, 1, 1) {
		return ComputeCapability{}, fmt.Errorf("%q is not a compute capability MAJOR.MINOR such as 8.0 or 7.5", s)
	}
	// Both parts are at most two digits: Atoi cannot fail.
	c := ComputeCapability{}
	c.Major, _ = strconv.Atoi(major)
	c.Minor, _ = strconv.Atoi(minor)
	if c.Major == 0 {
		return ComputeCapability{}, fmt.Errorf("%q is not a compute capability: they start at 1.0", s)
	}
	return c, nil
}

// digits reports whether s is lo to hi ASCII digits.
func digits(s string, lo, hi int) bool {
	if len(s) < lo || len(s) > hi {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
