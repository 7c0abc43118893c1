package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/fsview"
)

// The FUSE view is served by a process of its own, gpuletd started again with
// ViewProcessArg, which asks gpuletd over its socket for every read. In
// gpuletd's process, go-fuse's readers wait for requests in blocking read(2)
// calls that hold the Go runtime's Ps, and a flood of `cat`s of the view took
// half the node's lease throughput (section 9 of
// docs/benchmarks/readers-push-collector-reservations-kubelet.md); from a
// process of its own a read of the view costs gpuletd what an API read does.
//
// The view process reports on its standard output, in one line, whether it
// mounted ("mounted", or "error: " and why), then serves until its standard
// input ends (gpuletd closed it, or died) or it gets SIGTERM, and unmounts.
// It runs in a process group of its own, so that a Ctrl-C meant for gpuletd
// reaches gpuletd alone, which then stops it.

// ViewProcessArg, as gpuletd's first argument, makes it the view process:
// gpuletd view-process MOUNT SOCKET.
const ViewProcessArg = "view-process"

// RunViewProcess is the view process's main; it returns the exit status.
func RunViewProcess(args []string, log *slog.Logger) int {
	if len(args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: gpuletd %s MOUNT SOCKET (gpuletd starts it for --mount)\n", ViewProcessArg)
		return 2
	}
	mount, socket := args[0], args[1]
	log = log.With("view", mount)
	v, err := fsview.Mount(mount, fsview.NewRemote(socket, log), fsview.Options{Logger: log})
	if err != nil {
		fmt.Printf("error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 1
	}
	fmt.Println("mounted")
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	select {
	case <-done:
	case <-sig:
	}
	if err := v.Close(); err != nil {
		log.Error("cannot unmount the view", "err", err)
		return 1
	}
	return 0
}

// Backoff of view process restarts, and how long one may take to mount or
// to unmount before it is given up.
const (
	viewRestartFirst = time.Second
	viewRestartMax   = 30 * time.Second
	viewStartTimeout = 10 * time.Second
	viewStopTimeout  = 10 * time.Second
)

var errViewStopping = errors.New("gpuletd is stopping")

// viewProcess runs the view process, and starts it again, after a backoff,
// when it dies or could not mount (a mount point that cannot be used now may
// be put right; a view process of a gpuletd that died may still be leaving).
type viewProcess struct {
	mount, socket string
	log           *slog.Logger
	// status is called with the view's status at each change.
	status func(*api.ViewStatus)
	stop   chan struct{} // closed by Close
	// supervised is closed when the supervisor has returned: Close waits
	// for it, so that nothing of the view outlives gpuletd's stop.
	supervised chan struct{}

	// lastErr is why the last view process did not mount, logged once
	// however often it is tried again; only start uses it.
	lastErr string

	mu     sync.Mutex // guards cmd, stdin, exited and serving
	cmd    *exec.Cmd
	stdin  io.Closer
	exited chan struct{} // closed once cmd has exited and been waited for
	// serving says cmd mounted and has not exited: how it ends then matters
	// to Close.
	serving bool
}

// startView starts the view process and waits until it says whether it
// mounted; it then watches it.
func startView(mount, socket string, log *slog.Logger, status func(*api.ViewStatus)) *viewProcess {
	vp := &viewProcess{mount: mount, socket: socket, log: log, status: status, stop: make(chan struct{}), supervised: make(chan struct{})}
	mounted := vp.start()
	go func() {
		defer close(vp.supervised)
		vp.supervise(mounted)
	}()
	return vp
}

// start starts one view process and reports whether it mounted.
func (vp *viewProcess) start() bool {
	err := vp.run()
	if errors.Is(err, errViewStopping) {
		return false
	}
	st := &api.ViewStatus{Mount: vp.mount, Mounted: err == nil}
	if err == nil {
		if vp.lastErr != "" {
			vp.log.Info("the FUSE view is mounted after all", "mount", vp.mount)
		}
		vp.lastErr = ""
	} else {
		if err.Error() != vp.lastErr {
			vp.log.Warn("the FUSE view is not available; the API serves on without it, and tries it again now and then", "err", err)
		}
		st.Error, vp.lastErr = err.Error(), err.Error()
	}
	vp.status(st)
	return err == nil
}

// run starts a view process and waits for its first line.
func (vp *viewProcess) run() error {
	cmd, stdout, exited, err := vp.launch()
	if err != nil {
		return err
	}
	line := make(chan string, 1)
	// Waited for only once its output has been read to the end, as os/exec
	// asks: a line written just before the process ends is not lost.
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		vp.mu.Lock()
		if vp.cmd == cmd {
			vp.serving = false
		}
		vp.mu.Unlock()
		close(exited)
	}()
	select {
	case s := <-line:
		switch {
		case s == "mounted":
			vp.mu.Lock()
			vp.serving = vp.cmd == cmd
			vp.mu.Unlock()
			return nil
		case strings.HasPrefix(s, "error: "):
			return errors.New(strings.TrimPrefix(s, "error: "))
		}
		return errors.New("the view process ended before it mounted")
	case <-time.After(viewStartTimeout):
		cmd.Process.Kill()
		return fmt.Errorf("the view process did not mount within %s", viewStartTimeout)
	}
}

// launch starts a view process, unless Close has begun: under the lock, so
// that Close never misses one.
func (vp *viewProcess) launch() (*exec.Cmd, io.Reader, chan struct{}, error) {
	vp.mu.Lock()
	defer vp.mu.Unlock()
	select {
	case <-vp.stop:
		return nil, nil, nil, errViewStopping
	default:
	}
	// /proc/self/exe is this very binary, even once a package upgrade has
	// replaced the file gpuletd was started from.
	cmd := exec.Command("/proc/self/exe", ViewProcessArg, vp.mount, vp.socket)
	cmd.Args[0] = os.Args[0]
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot start the view process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		return nil, nil, nil, fmt.Errorf("cannot start the view process: %w", err)
	}
	// Start closes both pipes when it fails.
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("cannot start the view process: %w", err)
	}
	exited := make(chan struct{})
	vp.cmd, vp.stdin, vp.exited, vp.serving = cmd, stdin, exited, false
	return cmd, stdout, exited, nil
}

// supervise starts the view process again whenever it ends or did not
// mount, until Close: at first after viewRestartFirst, then after twice as
// long each time up to viewRestartMax, and after viewRestartFirst again once
// a view process has served that long.
func (vp *viewProcess) supervise(mounted bool) {
	backoff := viewRestartFirst
	for {
		if mounted {
			vp.mu.Lock()
			exited := vp.exited
			vp.mu.Unlock()
			started := time.Now()
			select {
			case <-vp.stop:
				return
			case <-exited:
			}
			if time.Since(started) >= viewRestartMax {
				backoff = viewRestartFirst
			}
			select {
			case <-vp.stop:
				return
			default:
			}
			vp.log.Warn("the view process ended; starting it again", "in", backoff)
			vp.status(&api.ViewStatus{Mount: vp.mount, Error: "the view process ended; it is started again"})
		}
		select {
		case <-vp.stop:
			return
		case <-time.After(backoff):
		}
		mounted = vp.start()
		backoff = min(2*backoff, viewRestartMax)
	}
}

// Close has the view process unmount and end: its standard input is closed,
// and it is killed if it has not ended within viewStopTimeout. One stuck
// beyond a kill (in the kernel) is left after another viewStopTimeout.
func (vp *viewProcess) Close() error {
	// Last: the supervisor, told to stop, returns once the process it may
	// be starting has answered or ended, which closing its input makes it.
	defer func() { <-vp.supervised }()
	vp.mu.Lock()
	close(vp.stop)
	cmd, stdin, exited, serving := vp.cmd, vp.stdin, vp.exited, vp.serving
	vp.mu.Unlock()
	if cmd == nil {
		return nil
	}
	stdin.Close()
	select {
	case <-exited:
	case <-time.After(viewStopTimeout):
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(viewStopTimeout):
		}
		return fmt.Errorf("the view process did not unmount %s within %s: killed", vp.mount, viewStopTimeout)
	}
	// One that did not mount, or had ended already, was logged then.
	if serving && !cmd.ProcessState.Success() {
		return fmt.Errorf("the view process: %s", cmd.ProcessState)
	}
	return nil
}
