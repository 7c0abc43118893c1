package mpsctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Errors callers may test with errors.Is.
var (
	// ErrBadMode: the --mps value is not one of on, off, auto.
	ErrBadMode = errors.New("mpsctl: bad --mps value")
	// ErrNotFound: --mps=on and the control binary is not there.
	ErrNotFound = errors.New("mpsctl: MPS control binary not found")
	// ErrTimeout: one run of the control binary took longer than Config.Timeout
	// and was killed.
	ErrTimeout = errors.New("mpsctl: control binary timed out")
	// ErrNoDaemon: no control daemon listens on the instance's pipe folder.
	ErrNoDaemon = errors.New("mpsctl: no control daemon")
	// ErrBadOutput: the control binary answered something that is not an answer.
	ErrBadOutput = errors.New("mpsctl: unexpected output from control binary")
	// ErrClosed: the Daemons was closed.
	ErrClosed = errors.New("mpsctl: closed")
)

const (
	// maxOutput bounds what one run may print; a correct answer is a few lines, and
	// a broken binary must not make gpuletd buffer without end.
	maxOutput = 64 << 10
	// waitDelay bounds how long a run waits for its output pipes after the process
	// exited or was killed, in case a child it forked still holds them.
	waitDelay = 500 * time.Millisecond
	// noDaemonMsg is what the front end prints when nothing listens on the pipe folder.
	noDaemonMsg = "Cannot find MPS control daemon process"
)

// runner runs the control binary. Every run is bounded by timeout, so that a hung
// binary or daemon cannot hang gpuletd.
type runner struct {
	path    string
	timeout time.Duration
}

// run executes the binary once with args and env, writes stdin to it, and returns
// what it printed on stdout.
func (r runner) run(ctx context.Context, env []string, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.timeout, fmt.Errorf("%w after %v", ErrTimeout, r.timeout))
	defer cancel()
	cmd := exec.CommandContext(ctx, r.path, args...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr cappedBuffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.WaitDelay = waitDelay
	err := cmd.Run()
	what := r.describe(stdin, args)
	if cause := context.Cause(ctx); cause != nil {
		// ErrTimeout when our own deadline fired, the caller's cause otherwise.
		return "", fmt.Errorf("%s: %w", what, cause)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String() + " " + stdout.String())
		if strings.Contains(msg, noDaemonMsg) {
			return "", fmt.Errorf("%s: %w", what, ErrNoDaemon)
		}
		return "", fmt.Errorf("%s: %w: %s", what, err, quote(msg))
	}
	return stdout.String(), nil
}

// describe names one run for error messages.
func (r runner) describe(stdin string, args []string) string {
	s := r.path
	if len(args) > 0 {
		s += " " + strings.Join(args, " ")
	}
	if stdin != "" {
		s += " <<< " + strings.Join(strings.Fields(stdin), " ")
	}
	return s
}

// cappedBuffer keeps the first maxOutput bytes written to it and drops the rest
// while reporting success, so that the process never blocks on a full pipe.
type cappedBuffer struct{ bytes.Buffer }

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// quote shortens and quotes output for an error message.
func quote(s string) string {
	const n = 120
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strconv.Quote(s)
}

// probeCommands is what one health probe sends: a harmless question whose answer
// has a known shape, and the list of live MPS servers.
const probeCommands = "get_default_active_thread_percentage\nget_server_list\n"

// parseProbe reads the answer to probeCommands: the default active thread
// percentage on the first line, then one server pid a line.
func parseProbe(out string) (servers []int, err error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	pct, err := strconv.ParseFloat(strings.TrimSpace(lines[0]), 64)
	if err != nil || pct <= 0 || pct > 100 {
		return nil, fmt.Errorf("%w: want a thread percentage, got %s", ErrBadOutput, quote(out))
	}
	servers, err = parsePIDs(lines[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: want server pids, got %s", ErrBadOutput, quote(out))
	}
	return servers, nil
}

// parseClients reads the answer to "get_client_list PID": one client pid a line.
// A server that ended between get_server_list and this question has no clients.
func parseClients(out string, server int) ([]int, error) {
	if strings.TrimSpace(out) == fmt.Sprintf("Server %d not found", server) {
		return nil, nil
	}
	pids, err := parsePIDs(strings.Split(out, "\n"))
	if err != nil {
		return nil, fmt.Errorf("%w: want client pids, got %s", ErrBadOutput, quote(out))
	}
	return pids, nil
}

// parsePIDs parses one positive pid a line; blank lines are skipped.
func parsePIDs(lines []string) ([]int, error) {
	var pids []int
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		pid, err := strconv.Atoi(l)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("not a pid: %q", l)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
