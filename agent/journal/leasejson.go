package journal

import (
	"slices"
	"strconv"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/jsonenc"
)

// AppendLease appends l as encoding/json encodes it (a fuzz test holds it to
// the same bytes), without walking it by reflection: a lease is encoded on
// every grant and renewal, under the lease lock, for the journal and the
// answer, and encoding/json's walk, map sorting and time marshaling cost
// several times more. It reports false, having appended nothing, for the rare
// leases it leaves to encoding/json: those with labels, a pod, a claim, a Slurm job or
// a usage, whole GPUs, and times encoding/json would refuse.
func AppendLease(b []byte, l *api.Lease) ([]byte, bool) {
	if len(l.Labels) > 0 || len(l.GPUs) > 0 || l.Pod != nil || l.Claim != nil || l.Slurm != nil || l.Usage != nil || !jsonenc.TimeOK(l.Created) || (l.Expires != nil && !jsonenc.TimeOK(*l.Expires)) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = jsonenc.String(b, l.ID)
	b = append(b, `,"gpu":{"index":`...)
	b = strconv.AppendInt(b, int64(l.GPU.Index), 10)
	b = append(b, `,"uuid":`...)
	b = jsonenc.String(b, l.GPU.UUID)
	b = append(b, `},"instance":`...)
	b = strconv.AppendInt(b, int64(l.Instance), 10)
	b = append(b, `,"units":`...)
	b = jsonenc.Ints(b, l.Units)
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
	b = jsonenc.Time(b, l.Created)
	if l.Expires != nil {
		b = append(b, `,"expires":`...)
		b = jsonenc.Time(b, *l.Expires)
	}
	b = jsonenc.OptionalString(b, `,"ttl":`, l.TTL)
	b = jsonenc.OptionalString(b, `,"binding":`, l.Binding)
	b = append(b, `,"preemptible":`...)
	b = strconv.AppendBool(b, l.Preemptible)
	b = jsonenc.OptionalString(b, `,"reservation":`, l.Reservation)
	b = jsonenc.OptionalString(b, `,"task":`, l.Task)
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
			b = jsonenc.String(b, k)
			b = append(b, ':')
			b = jsonenc.String(b, l.Env[k])
		}
		b = append(b, '}')
	}
	return append(b, '}'), true
}
