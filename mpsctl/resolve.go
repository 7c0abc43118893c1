package mpsctl

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
)

// Mode is the --mps flag: whether MPS must, may or must not run. [ParseMode]
// makes one from the flag's text, the only place that text is checked.
type Mode string

// Values of the --mps flag.
const (
	ModeOn   Mode = "on"
	ModeOff  Mode = "off"
	ModeAuto Mode = "auto"
)

// modes are the --mps values, in the order they are named to the user.
var modes = []Mode{ModeOn, ModeOff, ModeAuto}

// ParseMode reads an --mps value; any other than on, off and auto is an error
// wrapping [ErrBadMode] that names the flag, the value and the modes.
func ParseMode(s string) (Mode, error) {
	for _, m := range modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", badMode(fmt.Sprintf("--mps %q: want %s, %s or %s", s, ModeOn, ModeOff, ModeAuto))
}

// badMode is an error that matches [ErrBadMode] and says only its own
// message: the flag and its value, not the package that read it.
type badMode string

func (e badMode) Error() string        { return string(e) }
func (e badMode) Is(target error) bool { return target == ErrBadMode }

// Resolve turns the --mps flag (mode) and --mps-control (control: a name looked up
// in PATH, or a path) into the absolute path of the control binary and whether MPS
// is enabled. "off" never looks for the binary; "auto" enables MPS only when the
// binary is found; "on" without it is an error wrapping [ErrNotFound]. A Mode
// that is none of the three (not made by [ParseMode]) is an error wrapping
// [ErrBadMode] rather than taken for one of them.
func Resolve(mode Mode, control string) (path string, enabled bool, err error) {
	switch mode {
	case ModeOff:
		return "", false, nil
	case ModeOn, ModeAuto:
	default:
		return "", false, fmt.Errorf("%w: mode %q is none of on, off and auto", ErrBadMode, mode)
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

// Open makes the Daemons of gpuUUIDs for --mps=mode and starts them; cfg.Control
// is what [Resolve] returned (empty: MPS off, a null manager).
//
// "auto" means MPS where it works here, so no MPS problem stops gpuletd: when New
// refuses the configuration (a pipe folder too long for the control daemon) or
// Start brings up no instance at all (a control binary that exits at once, hangs or
// answers garbage), Open stops what it started, logs why, and returns a null
// manager. With "on" the same problems are an error. When some instances start and
// others do not, the others are down and retried by Check, in either mode: MPS
// works here, and their GPUs are degraded until they answer. When ctx ends during
// Start, Open returns the Daemons as they are: the caller is stopping.
func Open(ctx context.Context, mode Mode, cfg Config, gpuUUIDs []string) (*Daemons, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d, err := New(cfg, gpuUUIDs)
	if err == nil {
		err = d.Start(ctx)
		if err == nil || ctx.Err() != nil {
			return d, nil
		}
		if d.running() > 0 {
			log.Error("some MPS control daemons did not start; their GPUs are degraded and they are retried", "err", err)
			return d, nil
		}
		// A daemon that started but never answered is quit if it can be (what
		// Close cannot reach it logs); where none holds its lock, none runs.
		if d.anyLockHeld() {
			_ = d.Close()
		}
		err = fmt.Errorf("no MPS control daemon started: %w", err)
	}
	if cfg.Control == "" {
		return nil, err
	}
	if mode != ModeAuto {
		return nil, fmt.Errorf("--mps=%s: %w", mode, err)
	}
	log.Warn("MPS does not work here, so gpuletd runs without it (--mps=auto; --mps=on would stop instead)", "why", err.Error())
	cfg.Control = ""
	return New(cfg, gpuUUIDs)
}
