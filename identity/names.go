package identity

import (
	"os/user"
	"strconv"
)

// UserName says who uid is for a message: "alice (uid 1008)", or "uid 1008"
// where the user database has no name for it.
func UserName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return u.Username + " (uid " + id + ")"
	}
	return "uid " + id
}
