package config

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxPriority bounds a reservation's priority either way, as gpuletd does.
const MaxPriority = 1000

// DefaultMaxUserPriority is the highest reservation priority a user who is
// not an admin may ask without a reservations.max_user_priority key: 0, the
// default priority, so that by default no user can put a reservation in
// front of the others' (they may still step back, below 0); an admin who
// wants users to jump the line says how far.
const DefaultMaxUserPriority = 0

// parseReservations reads the reservations section: max_user_priority.
func (f *File) parseReservations(n *yaml.Node) error {
	return eachPair(n, "reservations", "a mapping with max_user_priority", func(key string, k, v *yaml.Node) error {
		if key != "max_user_priority" {
			return errorAt(k, "reservations", "unknown key %s (reservations has max_user_priority)", brief(key))
		}
		p, err := parsePriority(v, join("reservations", key))
		if err != nil {
			return err
		}
		f.MaxUserPriority = &p
		return nil
	})
}

func parsePriority(v *yaml.Node, path string) (int, error) {
	expected := "a whole number from -" + strconv.Itoa(MaxPriority) + " to " + strconv.Itoa(MaxPriority)
	text, err := scalar(v, path, expected)
	if err != nil {
		return 0, err
	}
	if v.ShortTag() != "!!int" || strings.Trim(strings.TrimPrefix(text, "-"), "0123456789") != "" {
		return 0, errorAt(v, path, "expected %s, found %s", expected, what(v))
	}
	p, err := strconv.Atoi(text)
	if err != nil || p < -MaxPriority || p > MaxPriority {
		return 0, errorAt(v, path, "%s is not %s", number(text), expected)
	}
	return p, nil
}

// UserPriorityCeiling is the highest reservation priority a user who is not
// an admin may ask: the file's reservations.max_user_priority, else
// DefaultMaxUserPriority (no config: the same).
func (r *Rules) UserPriorityCeiling() int {
	if r == nil || r.MaxUserPriority == nil {
		return DefaultMaxUserPriority
	}
	return *r.MaxUserPriority
}
