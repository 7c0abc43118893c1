// Package identity is who may do what, in one place: the caller as the
// kernel names it (Peer), the users and groups that pools, quotas and
// reservations' share groups name (Principal, one parsing rule for the config
// file, the API and the CLI), their resolution against the user database
// (Directory), and membership (Set, Principal.Matches). Security logic has
// one rule: everything else asks this package.
package identity

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// GroupPrefix marks a group: "group:ml", "group:2000".
const GroupPrefix = "group:"

// MaxName is the longest user or group name, in bytes.
const MaxName = 256

// Kind says whom a principal is about.
type Kind uint8

// Kinds of Principal.
const (
	User Kind = iota + 1
	Group
	Everyone
)

func (k Kind) String() string {
	switch k {
	case User:
		return "user"
	case Group:
		return "group"
	case Everyone:
		return "everyone"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Principal is a user, a group or everyone, as written: by name, or by id.
type Principal struct {
	Kind Kind
	// Name is the user or group as written, without "group:"; a uid or gid
	// when ByID. Empty for Everyone.
	Name string
	ByID bool
	ID   uint32 // when ByID
}

// String is the principal as written: "alice", "group:ml", "1001", "*".
func (p Principal) String() string {
	switch p.Kind {
	case Group:
		return GroupPrefix + p.Name
	case Everyone:
		return "*"
	}
	return p.Name
}

// Parse reads "*", a user name, a uid, "group:NAME" or "group:GID". Names are
// portable account names (POSIX) with the @ and $ of directory services and
// Samba; ids are 0 to 4294967294, since (uid_t)-1 means "no id" to the
// kernel's calls. The error says what is wrong and what to write.
func Parse(s string) (Principal, error) {
	if s == "*" {
		return Principal{Kind: Everyone}, nil
	}
	kind, name, what := User, s, "user"
	if rest, ok := strings.CutPrefix(s, GroupPrefix); ok {
		kind, name, what = Group, rest, "group"
	}
	if name == "" {
		if kind == Group {
			return Principal{}, fmt.Errorf(`"group:" names no group: write group:NAME`)
		}
		return Principal{}, fmt.Errorf("empty: write a user name, group:NAME or a uid")
	}
	if strings.Trim(name, "0123456789") == "" {
		n, err := strconv.ParseUint(name, 10, 32)
		if err != nil || n == math.MaxUint32 {
			return Principal{}, fmt.Errorf("%s id %s is out of range (0 to %d)", what, quoteNumber(name), uint32(math.MaxUint32-1))
		}
		return Principal{Kind: kind, Name: name, ByID: true, ID: uint32(n)}, nil
	}
	if msg := checkName(name); msg != "" {
		return Principal{}, fmt.Errorf("%s name %s %s: write a user name, group:NAME or a uid", what, Quote(name), msg)
	}
	return Principal{Kind: kind, Name: name}, nil
}

// checkName says what is wrong with a user or group name, or "".
func checkName(name string) string {
	switch {
	case len(name) > MaxName:
		return fmt.Sprintf("is longer than %d bytes", MaxName)
	case name[0] == '-':
		return "starts with -"
	case strings.ContainsFunc(name, func(r rune) bool { return !isAlnum(r) && !strings.ContainsRune("._-@$", r) }):
		return "holds a character other than letters, digits and . _ - @ $"
	}
	return ""
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// Quote shows a name in a message: quoted, and cut after 64 bytes.
func Quote(s string) string {
	const most = 64
	if len(s) > most {
		cut := most
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strconv.Quote(s)
}

// quoteNumber shows an id as written when it is short, else quoted.
func quoteNumber(s string) string {
	if len(s) <= 32 {
		return s
	}
	return Quote(s)
}
