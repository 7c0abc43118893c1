package mpsctl

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// Values of the --mps flag.
const (
	ModeOn   = "on"
	ModeOff  = "off"
	ModeAuto = "auto"
)

// Resolve turns the --mps flag (mode) and --mps-control (control: a name looked up
// in PATH, or a path) into the absolute path of the control binary and whether MPS
// is enabled. "off" never looks for the binary; "auto" enables MPS only when the
// binary is found; "on" without it is an error wrapping [ErrNotFound]; any other mode
// is an error wrapping [ErrBadMode].
func Resolve(mode, control string) (path string, enabled bool, err error) {
	switch mode {
	case ModeOff:
		return "", false, nil
	case ModeOn, ModeAuto:
	default:
		return "", false, fmt.Errorf("%w: --mps=%q: want %s, %s or %s", ErrBadMode, mode, ModeOn, ModeOff, ModeAuto)
	}
	p, err := exec.LookPath(control)
	if err != nil {
		if mode == ModeAuto {
			return "", false, nil
		}
		return "", false, fmt.Errorf("%w: --mps=on but --mps-control=%q: %v (install the Debian package nvidia-cuda-mps, or NVIDIA's driver utilities)", ErrNotFound, control, err)
	}
	// The path outlives the current directory: it is used for every later exec.
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", false, fmt.Errorf("mpsctl: %s: %w", p, err)
	}
	return abs, true, nil
}
