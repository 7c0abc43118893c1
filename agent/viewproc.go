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
// half the node's lease throughput (docs/BENCHMARKS.md, section 9); from a
// process of its own a read of the view costs gpuletd what an API read does.
//
// The view process reports on its standard output, in one line, whether it
// mounted ("mounted", or "error: " and why), then serves until its standard
// input ends (gpuletd closed it, or died) or it gets SIGTERM, and unmounts.

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
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
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

// viewProcess runs the view process, and starts it again, after a backoff,
// when it dies or could not mount (a mount point that cannot be used now may
// be put right; a view process of a gpuletd that died may still be leaving).
type viewProcess struct {
	mount, socket string
	log           *slog.Logger
	// status is called with the view's status at each change.
	status func(*api.ViewStatus)
	stop   chan struct{} // closed by Close

	// lastErr is why the last view process did not mount, logged once
	// however often it is tried again; supervise's own.
	lastErr string

	mu     sync.Mutex // guards cmd, stdin, exited and mounted
	cmd    *exec.Cmd
	stdin  io.Closer
	exited chan struct{} // closed when cmd has exited
	// mounted says cmd said it mounted: its exit then matters to Close.
	mounted bool
}

// startView starts the view process and waits until it says whether it
// mounted; it then watches it.
func startView(mount, socket string, log *slog.Logger, status func(*api.ViewStatus)) *viewProcess {
	vp := &viewProcess{mount: mount, socket: socket, log: log, status: status, stop: make(chan struct{})}
	mounted := vp.start()
	go vp.supervise(mounted)
	return vp
}

// start starts one view process and reports whether it mounted.
func (vp *viewProcess) start() bool {
	st := &api.ViewStatus{Mount: vp.mount}
	err := vp.run()
	switch {
	case err == nil:
		st.Mounted = true
		if vp.lastErr != "" {
			vp.log.Info("the FUSE view is mounted after all", "mount", vp.mount)
		}
		vp.lastErr = ""
	case err.Error() != vp.lastErr:
		vp.log.Warn("the FUSE view is not available; the API serves on without it, and tries it again now and then", "err", err)
		fallthrough
	default:
		st.Error, vp.lastErr = err.Error(), err.Error()
	}
	vp.mu.Lock()
	vp.mounted = err == nil
	vp.mu.Unlock()
	vp.status(st)
	return err == nil
}

// run starts a view process and waits for its first line.
func (vp *viewProcess) run() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot start the view process: %w", err)
	}
	cmd := exec.Command(exe, ViewProcessArg, vp.mount, vp.socket)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("cannot start the view process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("cannot start the view process: %w", err)
	}
	vp.mu.Lock()
	select {
	case <-vp.stop:
		vp.mu.Unlock()
		return errors.New("gpuletd is stopping")
	default:
	}
	if err := cmd.Start(); err != nil {
		vp.mu.Unlock()
		return fmt.Errorf("cannot start the view process: %w", err)
	}
	exited := make(chan struct{})
	vp.cmd, vp.stdin, vp.exited = cmd, stdin, exited
	vp.mu.Unlock()
	go func() { cmd.Wait(); close(exited) }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case s := <-line:
		switch {
		case s == "mounted":
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
// and it is killed if it has not ended within viewStopTimeout.
func (vp *viewProcess) Close() error {
	vp.mu.Lock()
	close(vp.stop)
	cmd, stdin, exited, mounted := vp.cmd, vp.stdin, vp.exited, vp.mounted
	vp.mu.Unlock()
	if cmd == nil {
		return nil
	}
	stdin.Close()
	select {
	case <-exited:
	case <-time.After(viewStopTimeout):
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("the view process did not unmount %s within %s: killed", vp.mount, viewStopTimeout)
	}
	// One that did not mount has ended with its error, logged already.
	if mounted && !cmd.ProcessState.Success() {
		return fmt.Errorf("the view process: %s", cmd.ProcessState)
	}
	return nil
}
