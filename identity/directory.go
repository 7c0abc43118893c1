package identity

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
)

// Directory turns user and group names into ids. Its errors say what is
// wrong without naming the file: "no user \"alice\" on this machine".
type Directory interface {
	LookupUser(name string) (uid uint32, err error)
	LookupGroup(name string) (gid uint32, err error)
}

// SystemDirectory is this machine's user database, through os/user: with
// cgo, the C library's (NSS: files, LDAP, SSSD, ...); built without cgo,
// /etc/passwd and /etc/group only.
type SystemDirectory struct{}

// LookupUser returns the uid of the user name.
func (SystemDirectory) LookupUser(name string) (uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return 0, fmt.Errorf("no user %q on this machine", name)
		}
		return 0, fmt.Errorf("looking up user %q: %w", name, err)
	}
	return parseID(u.Uid)
}

// LookupGroup returns the gid of the group name.
func (SystemDirectory) LookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		var unknown user.UnknownGroupError
		if errors.As(err, &unknown) {
			return 0, fmt.Errorf("no group %q on this machine", name)
		}
		return 0, fmt.Errorf("looking up group %q: %w", name, err)
	}
	return parseID(g.Gid)
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("the user database gave the id %q: %w", s, err)
	}
	return uint32(n), nil
}

// Resolve is the principal with its id: as written when ByID, else looked up
// in dir. Everyone has none.
func (p Principal) Resolve(dir Directory) (Principal, error) {
	if p.ByID || p.Kind == Everyone {
		return p, nil
	}
	lookup := dir.LookupUser
	if p.Kind == Group {
		lookup = dir.LookupGroup
	}
	id, err := lookup(p.Name)
	if err != nil {
		return p, err
	}
	p.ID = id
	return p, nil
}
