package lease

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/gpulet/gpulet/api"
)

// appendLeaseJSON appends l as encoding/json encodes it (a fuzz test holds it
// to the same bytes), without walking it by reflection: a lease is encoded on
// every grant and renewal, under the lease lock, and encoding/json's walk,
// map sorting and time marshaling cost several times more. It reports false,
// having appended nothing, for the rare leases it leaves to encoding/json:
// those with labels or a pod, and times encoding/json would refuse.
func appendLeaseJSON(b []byte, l *api.Lease) ([]byte, bool) {
	if len(l.Labels) > 0 || l.Pod != nil || !jsonTime(l.Created) || (l.Expires != nil && !jsonTime(*l.Expires)) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, l.ID)
	b = append(b, `,"gpu":{"index":`...)
	b = strconv.AppendInt(b, int64(l.GPU.Index), 10)
	b = append(b, `,"uuid":`...)
	b = appendJSONString(b, l.GPU.UUID)
	b = append(b, `},"instance":`...)
	b = strconv.AppendInt(b, int64(l.Instance), 10)
	b = append(b, `,"units":`...)
	if l.Units == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, u := range l.Units {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(u), 10)
		}
		b = append(b, ']')
	}
	b = append(b, `,"owner":{"uid":`...)
	b = strconv.AppendUint(b, uint64(l.Owner.UID), 10)
	b = append(b, `,"gid":`...)
	b = strconv.AppendUint(b, uint64(l.Owner.GID), 10)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(l.Owner.PID), 10)
	if len(l.Owner.Groups) > 0 {
		b = append(b, `,"groups":[`...)
		for i, g := range l.Owner.Groups {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(g), 10)
		}
		b = append(b, ']')
	}
	b = append(b, `},"created":`...)
	b = appendJSONTime(b, l.Created)
	if l.Expires != nil {
		b = append(b, `,"expires":`...)
		b = appendJSONTime(b, *l.Expires)
	}
	b = appendOptionalString(b, `,"ttl":`, l.TTL)
	b = appendOptionalString(b, `,"binding":`, l.Binding)
	b = append(b, `,"preemptible":`...)
	b = strconv.AppendBool(b, l.Preemptible)
	b = appendOptionalString(b, `,"reservation":`, l.Reservation)
	b = appendOptionalString(b, `,"task":`, l.Task)
	if l.MemoryMiB != 0 {
		b = append(b, `,"memory_mib":`...)
		b = strconv.AppendUint(b, l.MemoryMiB, 10)
	}
	b = append(b, `,"env":`...)
	if l.Env == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		// encoding/json sorts a map's keys; a lease's env has a handful.
		keys := make([]string, 0, 8)
		for k := range l.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, l.Env[k])
		}
		b = append(b, '}')
	}
	return append(b, '}'), true
}

// appendOptionalString appends key and s unless s is empty (omitempty).
func appendOptionalString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

// jsonTime says whether encoding/json encodes t (it refuses years outside
// 0–9999).
func jsonTime(t time.Time) bool {
	y := t.Year()
	return y >= 0 && y <= 9999
}

// appendJSONTime appends t as time.Time's MarshalJSON does.
func appendJSONTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendJSONString appends s quoted as encoding/json quotes it. Text that
// needs no escape, as ids, uuids, paths and numbers, is copied as it is;
// anything else (quotes, control bytes, HTML characters, non-ASCII) is left
// to encoding/json, whose rules are the contract.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
