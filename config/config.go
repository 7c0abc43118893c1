// Package config reads and checks gpuletd's config file (--config): named
// pools of GPUs and who may lease from them, quotas of units, task–engine
// profiles and the score policy's weights. See docs/design.md §11. It owns
// the file's syntax and its resolution for one node, not what the rules
// mean: pools and weights become placement's types, which the engine
// applies, so that the collector and the replay carry no YAML parser.
//
// It works in two steps. Parse checks everything that can be checked without
// the node: the YAML, the keys, the form of every name, number and duration.
// (*File).Resolve then turns the file into Rules for one node: GPU indices and
// UUIDs into the node's GPU indices, user and group names into ids. Rules are
// what the daemon consults on each request; a nil *Rules means "no config" and
// is safe to use: every GPU open to all, no quotas, no profiles, default
// weights.
//
// Errors name the line and the key: "line 7: pools.training.gpus[1]: ...".
// Parse and Resolve leave the file name out; Load, which reads a file, puts
// it in front.
//
// # Meaning
//
// A pool's users are user names, numeric uids, "group:NAME" and "group:GID";
// a number is taken as the id itself and not looked up, as chown(1) does (no
// user or group name is all digits on Linux). A pool without a users key is
// open to everyone; one with "users: []" to admins only (admins are bound by
// no pool and no quota; who is an admin is the daemon's business).
//
// A quota caps the units held at once: a user quota ("alice", "1001") the
// units that uid holds; a group quota ("group:ml") the units held by all
// members of that group together; the quota "*" the units held by everyone
// together. Every quota that applies to a request must hold.
//
// Profiles give a task's run time per GPU model, by the model's name as NVML
// reports it ("NVIDIA A100-SXM4-80GB", "Tesla T4").
//
// The score section weighs compute capability (cc), memory bandwidth and clock
// for the score placement policy; a weight left out of the section counts 0,
// and without the section each weighs 1/3.
//
// # Limits
//
// So that a file cannot make the daemon keep unbounded memory, or spend long
// on each request: a file holds at most MaxFileSize bytes of UTF-8, with at
// most MaxPools pools, MaxPoolGPUs GPUs and MaxPoolUsers users per pool,
// MaxQuotas quotas, MaxTasks tasks of MaxTaskModels GPU models each. Pool
// names have at most MaxPoolName bytes, other names MaxName. A quota is at
// most MaxQuota units, a weight at most MaxWeight, a GPU index at most
// MaxGPUIndex.
package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// Limits of a config file; the package comment says why.
const (
	MaxFileSize   = 1 << 20
	MaxPools      = 256
	MaxPoolGPUs   = 1024
	MaxPoolUsers  = 4096
	MaxQuotas     = 4096
	MaxTasks      = 4096
	MaxTaskModels = 64
	MaxPoolName   = 64
	MaxName       = 256
	MaxQuota      = 1_000_000
	MaxWeight     = 1000
	MaxGPUIndex   = 1023
)

// Error is what is wrong with a config file, and where.
type Error struct {
	// Line is the line the problem is on, from 1; 0: the file as a whole
	// (empty, too large).
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return e.Msg
	}
	return "line " + strconv.Itoa(e.Line) + ": " + e.Msg
}

// File is a config file as written, checked for form but not yet resolved
// against a node. Treat it as read-only.
type File struct {
	Pools    []PoolSpec  // in the file's order
	Quotas   []QuotaSpec // in the file's order
	Profiles map[string]map[string]time.Duration
	// Weights are the score section's, or 1/3 each without one.
	Weights placement.Weights
	// MaxUserPriority is reservations.max_user_priority; nil: not given.
	MaxUserPriority *int
}

// PoolSpec is a pool as written.
type PoolSpec struct {
	Name string
	Line int
	GPUs []GPUSpec
	// Everyone is true when the pool has no users key.
	Everyone bool
	Users    []Principal
}

// GPUSpec is one entry of a pool's gpus.
type GPUSpec struct {
	// UUID is set when the entry names a GPU by UUID; Index is used otherwise.
	UUID  string
	Index int
	Line  int
	path  string
}

// Principal is a user entry of a pool or the key of a quota, as written,
// with where it was written.
type Principal struct {
	identity.Principal
	Line int
	path string
}

// QuotaSpec is a quota as written.
type QuotaSpec struct {
	Who   Principal
	Limit int
}

// Load reads the config file at path and parses it. Its errors start with
// path: "/etc/gpulet/config.yaml: line 7: ...".
func Load(path string) (*File, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// readBounded reads a regular file, at most one byte more than a config
// file may hold, so that Parse can refuse a larger one without anything
// reading all of it. Anything but a regular file is refused before a byte is
// read: the file is opened without blocking and checked with fstat, so that a
// FIFO put at the path (whose open or read waits for a writer that may never
// come) or a device that never ends cannot hold the reader.
func readBounded(path string) ([]byte, error) {
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, pathError(path, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, pathError(path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s: is a directory", path)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fileKind(st.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
	if err != nil {
		return nil, pathError(path, err)
	}
	return data, nil
}

// fileKind names what a path that is not a regular file is.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return m.Type().String()
}

// pathError reads "FILE: no such file or directory", as the other errors of
// a file read "FILE: line N: ...".
func pathError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", path, pe.Err)
	}
	return fmt.Errorf("%s: %w", path, err)
}
