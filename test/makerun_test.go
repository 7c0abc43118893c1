package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// clonePathLen is about how long the clone's path is: longer than the MPS pipe
// folder (87 bytes) and a Unix socket path (107) could take if make run put them
// in the clone.
const clonePathLen = 150

// TestMakeRun runs the quick start, `make run`, from a clone at a long path, as
// root and as a plain user (without and with $XDG_RUNTIME_DIR): it waits for the
// banner's GPULET_SOCKET to answer `bin/gpulet status`, checks MPS runs when it is
// installed, and stops it with SIGINT as Ctrl-C does. The binaries the harness
// built stand in for make's build step (NO_BUILD=1); the path choice is the
// Makefile's.
func TestMakeRun(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run make as a plain user; runs as", os.Getuid())
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed:", err)
	}
	_, mpsErr := exec.LookPath("nvidia-cuda-mps-control")
	if mpsErr != nil {
		t.Log("nvidia-cuda-mps-control is absent, so MPS is not checked:", mpsErr)
	}
	if gpus, _ := filepath.Glob("/dev/nvidia[0-9]*"); len(gpus) > 0 && mpsErr == nil {
		// A private instance on a host with GPUs simulates without MPS
		// (TestMakeRunBesideGPUs).
		mpsErr = fmt.Errorf("the host has GPUs (%s): make run's private instances run without MPS", gpus[0])
		t.Log(mpsErr)
	}
	nu := e2e.NewUserWithGroup(t)
	u := &nu

	t.Run("root", func(t *testing.T) {
		// Root's default is the system's /run/gpulet: a test takes a folder of its own.
		runDir := shortTemp(t, "gmr")
		clone := makeClone(t, nil)
		r := startMakeRun(t, clone, nil, os.Environ(), "RUN_DIR="+runDir)
		r.check(t, filepath.Join(runDir, "gpulet.sock"), mpsErr == nil)
		r.stop(t)
		if _, err := os.Stat(filepath.Join(clone, ".run", "run-dir")); err == nil {
			t.Fatal("make run recorded a RUN_DIR it did not choose, for make clean to remove")
		}
	})

	userEnv := []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "LANG=C"}
	for _, c := range []struct {
		name string
		xdg  bool
	}{{name: "user", xdg: false}, {name: "user with XDG_RUNTIME_DIR", xdg: true}} {
		t.Run(c.name, func(t *testing.T) {
			want := fmt.Sprintf("/tmp/gpulet-%d", u.UID)
			env := userEnv
			if c.xdg {
				xdg := shortTemp(t, "gx")
				chown(t, xdg, u)
				want = filepath.Join(xdg, "gpulet")
				env = append(env, "XDG_RUNTIME_DIR="+xdg)
			}
			t.Cleanup(func() { killControlDaemons(want); os.RemoveAll(want) })
			clone := makeClone(t, u)
			r := startMakeRun(t, clone, u, env)
			r.check(t, filepath.Join(want, "gpulet.sock"), mpsErr == nil)
			out, code := e2e.Output(t, userCmd(u, clone, env, "make", "clean"))
			if _, err := os.Stat(r.socket); code == 0 || !strings.Contains(out, "still runs") || err != nil {
				t.Fatalf("make clean while gpuletd runs: exit %d, socket %v\n%s", code, err, out)
			}
			r.stop(t)
			fi, err := os.Lstat(want)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != u.UID {
				t.Fatalf("run dir %s: %v %v, want the user's own folder of mode 0700", want, fi, err)
			}

			// make clean removes what make run made, the run dir outside the clone too.
			out, code = e2e.Output(t, userCmd(u, clone, env, "make", "clean"))
			if code != 0 {
				t.Fatalf("make clean: exit %d\n%s", code, out)
			}
			for _, gone := range []string{want, filepath.Join(clone, ".run"), filepath.Join(clone, "bin")} {
				if _, err := os.Lstat(gone); !os.IsNotExist(err) {
					t.Errorf("%s is still there after make clean (%v)\n%s", gone, err, out)
				}
			}
		})
	}

	// Another user made /tmp/gpulet-UID first (a folder, or a symlink to one of
	// the user's): make run refuses it instead of putting the socket there.
	t.Run("user refuses a planted run dir", func(t *testing.T) {
		planted := fmt.Sprintf("/tmp/gpulet-%d", u.UID)
		mine := shortTemp(t, "gm")
		chown(t, mine, u)
		clone := makeClone(t, u)
		for _, plant := range []func() error{
			func() error { return os.Mkdir(planted, 0o777) },
			func() error { return os.Symlink(mine, planted) },
		} {
			if err := plant(); err != nil {
				t.Fatal(err)
			}
			out, code := e2e.Output(t, userCmd(u, clone, userEnv, "make", "run", "NO_BUILD=1"))
			os.Remove(planted)
			if code == 0 || !strings.Contains(out, "not a folder of yours") || strings.Contains(out, "gpuletd starts") {
				t.Fatalf("make run with %s planted: exit %d\n%s", planted, code, out)
			}
		}
		if ents, _ := os.ReadDir(mine); len(ents) != 0 {
			t.Fatalf("make run wrote %v through the symlink", ents)
		}
	})
}

// userCmd runs name as u (root when u is nil) in dir, in a process group of
// its own.
func userCmd(u *e2e.User, dir string, env []string, name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Dir = dir
	c.Env = env
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		u.Command(c)
	}
	return c
}

func chown(t *testing.T, path string, u *e2e.User) {
	t.Helper()
	if err := os.Chown(path, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
}

// shortTemp is a fresh folder with a short path, removed at the end.
func shortTemp(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killControlDaemons(dir); os.RemoveAll(dir) })
	return dir
}

// makeClone copies the module's files as a clone has them (no .git, no build
// outputs) to a path of about clonePathLen bytes, with the harness's binaries in
// its bin/, owned by u when u is not nil.
func makeClone(t *testing.T, u *e2e.User) string {
	t.Helper()
	src, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("", "gpulet-newcomer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	pad := max(1, clonePathLen-len(base)-len("//gpulet"))
	clone := filepath.Join(base, strings.Repeat("p", pad), "gpulet")
	err = filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		// What .gitignore leaves out, and git's own folder.
		if rel == ".git" || rel == "bin" || rel == ".run" || strings.HasSuffix(rel, ".test") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(clone, rel)
		if e.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !e.Type().IsRegular() {
			return nil
		}
		return copyFile(p, dst)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range e2e.Binaries {
		if err := copyFile(e2e.Bin(b.Name), filepath.Join(clone, "bin", b.Name)); err != nil {
			t.Fatal(err)
		}
	}
	// The user reaches the clone through folders MkdirTemp made private.
	for d := clone; d != filepath.Dir(base); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	if u != nil {
		filepath.WalkDir(clone, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				err = os.Lchown(p, int(u.UID), int(u.GID))
			}
			return err
		})
	}
	t.Logf("clone at %s (%d bytes)", clone, len(clone))
	return clone
}

// copyFile copies src to dst with src's mode, creating dst's folder.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// makeRun is one `make run` in the foreground.
type makeRun struct {
	cmd    *exec.Cmd
	u      *e2e.User
	clone  string
	env    []string
	out    *testutil.SyncBuffer
	socket string // from the banner
	done   chan error
}

// startMakeRun starts `make run NO_BUILD=1 vars...` in clone as u (root when nil)
// and reads the banner up to its GPULET_SOCKET.
func startMakeRun(t *testing.T, clone string, u *e2e.User, env []string, vars ...string) *makeRun {
	t.Helper()
	r := &makeRun{u: u, clone: clone, env: env, out: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	r.cmd = userCmd(u, clone, env, "make", append([]string{"run", "NO_BUILD=1"}, vars...)...)
	pr, pw := io.Pipe()
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { err := r.cmd.Wait(); pw.Close(); r.done <- err }()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		if t.Failed() {
			t.Logf("make run's output:\n%s", r.out)
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(r.out, line)
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "export GPULET_SOCKET="); ok {
				select {
				case found <- s:
				default:
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case r.socket = <-found:
	case err := <-r.done:
		t.Fatalf("make run ended before its banner: %v\n%s", err, r.out)
	case <-time.After(20 * time.Second):
		t.Fatalf("no GPULET_SOCKET in make run's banner within 20s:\n%s", r.out)
	}
	return r
}

// check waits until `bin/gpulet status` answers on the banner's socket, and
// checks the socket is where the test expects and MPS runs when wanted.
func (r *makeRun) check(t *testing.T, wantSocket string, wantMPS bool) {
	t.Helper()
	if r.socket != wantSocket || len(r.socket) > 107 {
		t.Fatalf("banner says GPULET_SOCKET=%s, want %s", r.socket, wantSocket)
	}
	env := append(r.env, "GPULET_SOCKET="+r.socket)
	var out string
	code := -1
	deadline := time.Now().Add(20 * time.Second)
	for code != 0 {
		select {
		case err := <-r.done:
			t.Fatalf("make run ended: %v\n%s", err, r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("bin/gpulet status did not answer within 20s: exit %d\n%s", code, out)
		}
		time.Sleep(20 * time.Millisecond)
		out, code = e2e.Output(t, userCmd(r.u, r.clone, env, "bin/gpulet", "status"))
	}
	if !strings.Contains(out, "backend: simulated") {
		t.Fatalf("bin/gpulet status:\n%s", out)
	}
	out, code = e2e.Output(t, userCmd(r.u, r.clone, env, "bin/gpulet", "status", "--json"))
	var s api.Snapshot
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil {
		t.Fatalf("bin/gpulet status --json: exit %d %v\n%s", code, err, out)
	}
	if wantMPS && s.MPS != "on" {
		t.Fatalf("mps is %q, want on (nvidia-cuda-mps-control is installed)\n%s", s.MPS, r.out)
	}
}

// stop sends SIGINT to make's process group, as Ctrl-C in its terminal does,
// waits for gpuletd's clean stop, and checks it logged no error.
func (r *makeRun) stop(t *testing.T) {
	t.Helper()
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("make run did not end within 20s of SIGINT\n%s", r.out)
	}
	if !strings.Contains(r.out.String(), "gpuletd stopping") {
		t.Fatalf("gpuletd did not stop cleanly:\n%s", r.out)
	}
	// The quick start is what a newcomer sees first: nothing in it is an error.
	if strings.Contains(r.out.String(), "level=ERROR") {
		t.Fatalf("make run logged an error:\n%s", r.out)
	}
	runDir := filepath.Dir(r.socket)
	testutil.Eventually(t, "the MPS control daemons to quit", func() bool { return len(controlDaemons(runDir)) == 0 })
}
