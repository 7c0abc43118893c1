package pipefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// UsersFile, beside layout.json, says whom each MPS instance serves as gpuletd
// last saw it: the owners of its leases and offline claims and the user of its
// live MPS server. An MPS server serves one user at a time, and a client of
// another user waits until that user's clients are gone (on an H100 an offline
// claim waited 50 s for another user's job), so an offline claimer keeps to
// instances that serve nobody else. gpuletd writes it when it changes and
// removes it when it stops.
const UsersFile = "users.json"

// UsersSchema is the schema of users.json.
const UsersSchema = "gpulet.users/v1"

// MaxUsers bounds what ReadUsers reads.
const MaxUsers = 16 << 20

// Users is users.json.
type Users struct {
	Schema string `json:"schema"`
	// PID is gpuletd's: a file whose writer is gone says nothing (it stopped
	// without removing it), as if there were none.
	PID int `json:"pid"`
	// GPUs holds, by GPU UUID and then by instance, the uids an instance
	// serves, ascending.
	GPUs map[string][][]uint32 `json:"gpus"`
	// Surplus holds, by GPU UUID and then by instance, the uids whose units
	// there keep nobody off, ascending: a user's holds bind only as many
	// instances as their units fill (docs/design.md §1.3). Their claims'
	// FIFOs there do not keep a claimer off. Absent when there are none.
	Surplus map[string][][]uint32 `json:"surplus,omitempty"`
}

// Of is the uids instance k of GPU uuid serves; nil when u is nil or says
// nothing of it.
func (u *Users) Of(uuid string, k int) []uint32 {
	if u == nil || k < 0 || k >= len(u.GPUs[uuid]) {
		return nil
	}
	return u.GPUs[uuid][k]
}

// SurplusOf is the uids whose holds on instance k of GPU uuid keep nobody off;
// nil when u is nil or says nothing of it.
func (u *Users) SurplusOf(uuid string, k int) []uint32 {
	if u == nil || k < 0 || k >= len(u.Surplus[uuid]) {
		return nil
	}
	return u.Surplus[uuid][k]
}

// EncodeUsers is users.json for u, uids sorted: the same users give the same
// bytes, so that a writer can tell when nothing changed.
func EncodeUsers(u Users) ([]byte, error) {
	u.Schema = UsersSchema
	for _, m := range []map[string][][]uint32{u.GPUs, u.Surplus} {
		for _, ins := range m {
			for _, uids := range ins {
				slices.Sort(uids)
			}
		}
	}
	b, err := json.Marshal(u)
	return append(b, '\n'), err
}

// DecodeUsers parses users.json.
func DecodeUsers(b []byte) (*Users, error) {
	var u Users
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("malformed users file: %w", err)
	}
	if u.Schema != UsersSchema {
		return nil, fmt.Errorf("users file schema %q, want %q", u.Schema, UsersSchema)
	}
	if u.PID < 1 {
		return nil, fmt.Errorf("users file: pid %d", u.PID)
	}
	return &u, nil
}

// ReadUsers reads <runDir>/units/users.json. It returns nil and no error when
// there is none or its writer is no longer running: then nothing is known of
// the instances' users but the owners of their offline claims, and under MPS
// a claimer refuses (package offline).
func ReadUsers(runDir string) (*Users, error) {
	path := filepath.Join(UnitsRoot(runDir), UsersFile)
	b, err := readCapped(path, MaxUsers)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	u, err := DecodeUsers(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// EPERM: the writer runs as another user, as gpuletd does for all but
	// root. Only ESRCH says it is gone.
	if errors.Is(unix.Kill(u.PID, 0), unix.ESRCH) {
		return nil, nil
	}
	return u, nil
}
