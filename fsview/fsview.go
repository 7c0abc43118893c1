// Package fsview shows the daemon's current snapshot as plain files on a
// read-only FUSE mount (docs/design.md §9), so that `cat /run/gpulet/view/free_units`
// answers without a client.
//
// fsview owns the mount and nothing else: it keeps no state of its own, and
// every lookup, listing and open asks the Source for the snapshot current at
// that moment. The layout lives in pure functions of one snapshot (tree.go);
// the FUSE nodes (node.go) are a thin adapter over them. File bytes are rendered
// at Open into the file handle and served with direct I/O, so one open reads one
// snapshot and the kernel caches no value.
package fsview

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/snapshot"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Source gives the current published snapshot; *snapshot.Store satisfies it.
// Load may return nil while the daemon has published nothing yet.
type Source interface {
	Load() *snapshot.Published
}

// latestSource is a Source for which Load costs a request (Remote): Latest
// returns the snapshot last loaded, when that was moments ago, without asking
// again (nil otherwise). Attributes come from it, since no read depends on
// them (files are read with direct I/O, their bytes rendered at open), so
// that a `cat` among others asks once, at open.
type latestSource interface {
	Source
	Latest() *snapshot.Published
}

// Options tune Mount. The zero value is ready to use.
type Options struct {
	// Logger receives the view's messages; nil means slog.Default().
	Logger *slog.Logger
	// Debug logs every FUSE request and reply at debug level.
	Debug bool
}

// View is one mounted view. Close unmounts it.
type View struct {
	dir    string
	server *fuse.Server
	log    *slog.Logger

	closeOnce sync.Once
	closeErr  error
}

// Mount mounts the view of src at dir, creating dir if it is missing, and
// serves it until Close. A stale mount left at dir by a crashed daemon is
// detached and replaced; a live one is an error.
//
// As root the view is mounted directly, readable by every user (allow_other);
// otherwise through fusermount3, and readable by others only if /etc/fuse.conf
// allows user_allow_other. The kernel checks permissions (default_permissions),
// which keeps each lease file to its owner.
//
// Until src has a snapshot, the root lists its fixed names, opening any of them
// fails with EAGAIN, and gpus/ and leases/ are empty.
func Mount(dir string, src Source, opts Options) (*View, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if src == nil {
		return nil, fmt.Errorf("cannot mount view at %s: no snapshot source", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot mount view at %s: %w", dir, err)
	}
	// The mount point first: a path that can never work is the first thing
	// to say, whether or not this user may mount.
	if err := prepare(abs, log); err != nil {
		return nil, fmt.Errorf("cannot mount view at %s: %w", abs, err)
	}
	if err := checkFUSE(); err != nil {
		return nil, fmt.Errorf("cannot mount view at %s: %w", abs, err)
	}

	root := &node{t: &tree{src: src, mounted: time.Now()}, kind: kindDir}
	mo := mountOptions(opts.Debug, log)
	rawFS := fs.NewNodeFS(root, &fs.Options{
		// Timeouts are left at zero here and raised per node where nothing can
		// change (see cacheTimeout).
		Logger: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	})
	server, err := fuse.NewServer(rawFS, abs, &mo)
	if err != nil {
		return nil, fmt.Errorf("cannot mount view at %s: %w", abs, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		_ = server.Unmount()
		return nil, fmt.Errorf("cannot mount view at %s: %w", abs, err)
	}
	log.Info("view mounted", "dir", abs, "allow_other", mo.AllowOther)
	return &View{dir: abs, server: server, log: log}, nil
}

// Close unmounts the view. If a user keeps it busy (an open file, a shell in
// it), the mount is detached lazily and goes away with its last user. Close is
// safe to call more than once; later calls return the first result.
func (v *View) Close() error {
	v.closeOnce.Do(func() {
		err := v.server.Unmount()
		if err == nil {
			return
		}
		if derr := detach(v.dir); derr != nil {
			v.closeErr = fmt.Errorf("cannot unmount view at %s: %w", v.dir, errors.Join(err, derr))
			return
		}
		v.log.Warn("view busy, detached lazily", "dir", v.dir, "err", err)
	})
	return v.closeErr
}

func mountOptions(debugFUSE bool, log *slog.Logger) fuse.MountOptions {
	root := os.Geteuid() == 0
	return fuse.MountOptions{
		FsName: "gpulet",
		Name:   "gpulet",
		// ro makes the kernel refuse every write before it reaches us;
		// default_permissions has it enforce the modes and owners we report.
		Options:          []string{"ro", "default_permissions"},
		DirectMountFlags: syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC,
		// As root, mount(2) needs no helper; go-fuse falls back to fusermount3
		// if it fails (e.g. without CAP_SYS_ADMIN in a container).
		DirectMount: root,
		AllowOther:  root || userAllowOther(),
		// No extended attributes: the kernel stops asking after the first
		// ENOSYS, which saves `ls -l` a round trip per file.
		DisableXAttrs: true,
		Debug:         debugFUSE,
		Logger:        slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		PanicHandler: func(v any) fuse.Status {
			log.Error("panic in view", "panic", v, "stack", string(debug.Stack()))
			return fuse.EIO
		},
	}
}

// checkFUSE says plainly what is missing for a mount, where fusermount3 would
// only print "failed to open /dev/fuse" and exit non-zero.
func checkFUSE() error {
	if os.Geteuid() == 0 {
		return nil
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		return errors.New("not root and no fusermount3 found (install Debian's fuse3)")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("not root and /dev/fuse cannot be opened (%w)", err)
	}
	return f.Close()
}

// prepare makes dir ready to be mounted on: it removes a stale mount, creates a
// missing directory and refuses a live mount.
func prepare(dir string, log *slog.Logger) error {
	for attempt := 0; ; attempt++ {
		// statfs always reaches the FUSE server, where stat may be answered
		// from attributes the kernel still caches for a dead mount's root.
		var sfs syscall.Statfs_t
		err := syscall.Statfs(dir, &sfs)
		if !isStale(err) {
			break
		}
		// The daemon that served this mount died without unmounting.
		if attempt == 3 {
			return fmt.Errorf("stale mount remains after %d lazy unmounts: %w", attempt, err)
		}
		log.Warn("replacing stale view mount", "dir", dir, "err", err)
		if err := detach(dir); err != nil {
			return fmt.Errorf("cannot remove stale mount: %w", err)
		}
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return err
	case !st.IsDir():
		return errors.New("not a directory")
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if mounted {
		return errors.New("something is mounted there already (is another gpuletd running?)")
	}
	return nil
}

// isStale reports whether err is what the kernel answers on a FUSE mount whose
// server is gone.
func isStale(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// detach lazily unmounts dir: it vanishes at once for new lookups and is torn
// down when its last user lets go.
func detach(dir string) error {
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err == nil {
			return nil
		}
	}
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		if bin, err = exec.LookPath("fusermount"); err != nil {
			return errors.New("cannot unmount: no permission to umount and no fusermount3")
		}
	}
	out, err := exec.Command(bin, "-u", "-z", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -u -z: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	return nil
}

// isMountPoint reports whether dir (absolute, clean) is a mount point in this
// process's mount namespace.
func isMountPoint(dir string) (bool, error) {
	// mountinfo names mount points with symlinks resolved.
	if parent, err := filepath.EvalSymlinks(filepath.Dir(dir)); err == nil {
		dir = filepath.Join(parent, filepath.Base(dir))
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// Fields: id parent major:minor root mount-point options ...
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// userAllowOther reports whether /etc/fuse.conf lets users mount with
// allow_other.
func userAllowOther() bool {
	b, err := os.ReadFile("/etc/fuse.conf")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(line) == "user_allow_other" {
			return true
		}
	}
	return false
}
