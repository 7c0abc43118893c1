package identity

import (
	"os"
	"slices"
)

// Peer is who calls, as SO_PEERCRED told.
type Peer struct {
	UID, GID uint32
	PID      int
	Admin    bool

	// Groups are the caller's supplementary groups.
	Groups []uint32
	// PIDFD, when not nil, holds the process that connected (SO_PEERPIDFD):
	// a lease bound to the caller's own process is bound to exactly it. Who
	// made the Peer closes it (the API server, when the request is done);
	// the lease engine keeps a duplicate of what it needs.
	PIDFD *os.File
}

// InGroup reports whether the caller had gid as its group or among its
// supplementary groups when it connected.
func (p Peer) InGroup(gid uint32) bool {
	return p.GID == gid || slices.Contains(p.Groups, gid)
}

// GIDs are the caller's groups, its primary group first, each once: the
// groups whose pools it may use and whose quotas its leases count toward.
func (p Peer) GIDs() []uint32 { return GroupsOf(p.GID, p.Groups) }

// GroupsOf is a primary group and supplementary groups as one list, the
// primary first, each once.
func GroupsOf(primary uint32, supplementary []uint32) []uint32 {
	out := make([]uint32, 0, len(supplementary)+1)
	out = append(out, primary)
	for _, g := range supplementary {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// Nobody is the caller a network peer is: no uid and no group (the
// kernel's (uid_t)-1, which no account has), no pid, no admin. A handler
// that looks at it sees no one, never root.
var Nobody = Peer{UID: ^uint32(0), GID: ^uint32(0)}
