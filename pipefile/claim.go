package pipefile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"golang.org/x/sys/unix"
)

// Folder is an open instance folder. Every step of the protocol runs relative
// to its descriptor, so that no step walks a path that could be swapped under
// it, and no step follows a symlink at a unit name.
type Folder struct {
	fd   int
	path string
}

// OpenFolder opens the instance folder at path, refusing a symlink there.
func OpenFolder(path string) (*Folder, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &Folder{fd: fd, path: path}, nil
}

// Close closes the folder's descriptor; claims made through it stay.
func (f *Folder) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}

// FD is the folder's descriptor, for the *at calls of the folder's owner.
func (f *Folder) FD() int { return f.fd }

// Path is the folder's path, for messages.
func (f *Folder) Path() string { return f.path }

// Stat describes the entry at unit u's name without following it: a claim is
// the FIFO itself, and its owner is the FIFO's.
func (f *Folder) Stat(u int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(f.fd, UnitName(u), &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// Owner is the uid that owns the folder: gpuletd's, whose own FIFOs (its
// leases') are its uid's too.
func (f *Folder) Owner() (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: f.path, Err: err}
	}
	return st.Uid, nil
}

// IsFIFO says whether a Stat result is a FIFO, the only entry that claims.
func IsFIFO(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFIFO }

// Claim claims unit u by the protocol of docs/design.md §5: a FIFO under a
// temporary name starting with ".", locked with flock(LOCK_EX) through an
// O_RDWR|O_NONBLOCK descriptor, linked to unit-<u>, the temporary name
// removed. ok is false when the unit is taken (the link met EEXIST). fd holds
// the lock; it is not close-on-exec, so that a command exec'd after the claim
// holds it for its whole life.
func (f *Folder) Claim(u int) (fd int, ok bool, err error) {
	tmp, err := f.makeTempFIFO()
	if err != nil {
		return -1, false, err
	}
	// The temporary name goes in every case: after a link the unit name holds
	// the FIFO, and otherwise nothing should.
	defer unix.Unlinkat(f.fd, tmp, 0)
	// O_RDWR opens a FIFO without waiting for a peer.
	fd, err = unix.Openat(f.fd, tmp, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, false, fmt.Errorf("cannot open claim FIFO %s/%s: %w", f.path, tmp, err)
	}
	// Locked before it has a unit name, so that gpuletd never sees the claim
	// unlocked and takes it for stale.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot lock claim FIFO %s/%s: %w", f.path, tmp, err)
	}
	err = unix.Linkat(f.fd, tmp, f.fd, UnitName(u), 0)
	if errors.Is(err, unix.EEXIST) {
		unix.Close(fd)
		return -1, false, nil
	}
	if err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot link claim to %s/%s: %w", f.path, UnitName(u), err)
	}
	return fd, true, nil
}

// makeTempFIFO makes a FIFO under a fresh name starting with ".", which is no
// unit name. A random part keeps claimers apart, including a dead one's
// leftover under a pid now reused.
func (f *Folder) makeTempFIFO() (string, error) {
	for range 16 {
		tmp := fmt.Sprintf(".claim-%d-%08x", os.Getpid(), rand.Uint32())
		err := unix.Mkfifoat(f.fd, tmp, 0o600)
		if err == nil {
			return tmp, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("cannot make a claim FIFO in %s: %w", f.path, err)
		}
	}
	return "", fmt.Errorf("cannot make a claim FIFO in %s: every name tried exists", f.path)
}

// Unclaim gives unit u back: its name is removed while fd still holds the
// lock, so that gpuletd never counts the claim stale meanwhile, then fd is
// closed.
func (f *Folder) Unclaim(u, fd int) {
	unix.Unlinkat(f.fd, UnitName(u), 0)
	unix.Close(fd)
}

// ErrNotFIFO means the entry at a unit name is not a FIFO: no claim.
var ErrNotFIFO = errors.New("not a FIFO")

// TryLock opens the FIFO at unit u's name, without following a symlink, and
// takes its lock without waiting. held is true when another process holds the
// lock: the FIFO is a live claim, and fd is -1. Otherwise fd holds the lock
// (close-on-exec) until closed and st describes the FIFO. ErrNotFIFO: the
// entry is something else.
func (f *Folder) TryLock(u int) (fd int, st unix.Stat_t, held bool, err error) {
	// Looked at before it is opened, so that nothing but a FIFO is: opening
	// a file someone planted could have effects of its own.
	if st, err = f.Stat(u); err != nil {
		return -1, st, false, err
	}
	if !IsFIFO(&st) {
		return -1, st, false, ErrNotFIFO
	}
	fd, err = unix.Openat(f.fd, UnitName(u), unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ETXTBSY) {
			// Swapped since: a symlink, a folder, a socket, a running program.
			err = ErrNotFIFO
		}
		return -1, st, false, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, false, err
	}
	if !IsFIFO(&st) {
		unix.Close(fd)
		return -1, st, false, ErrNotFIFO
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, st, true, nil
		}
		return -1, st, false, err
	}
	return fd, st, false, nil
}

// Held reports whether unit u's FIFO is locked by some process: the mark of a
// live claim. The daemon never locks its own FIFOs.
func (f *Folder) Held(u int) bool {
	fd, _, held, err := f.TryLock(u)
	if err == nil && !held {
		unix.Close(fd)
	}
	return held
}
