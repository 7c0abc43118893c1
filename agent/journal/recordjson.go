package journal

import (
	"bytes"
	"math"
	"time"
	"unicode/utf8"
)

// decodeRecordJSON reads body into r as encoding/json would (unknown fields
// refused), for the records the journal's own encoder writes: compact, keys
// as the struct tags spell them and each once, strings without escapes, no
// labels, pod, Slurm job or usage. It reports false for anything else, r then
// holding whatever it had read: the caller starts again with encoding/json.
// A fuzz test holds what it accepts to encoding/json's result. A restart
// reads every lease back through here, and encoding/json's reflection was
// most of the time it took.
func decodeRecordJSON(body []byte, r *Record) bool {
	d := scanner{b: body}
	return d.record(r) && d.i == len(d.b)
}

// scanner reads b from i on.
type scanner struct {
	b []byte
	i int
}

func (d *scanner) record(r *Record) bool {
	return d.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "op":
			r.Op, ok = d.string()
		case "schema":
			r.Schema, ok = d.string()
		case "entry":
			r.Entry = new(Entry)
			ok = d.entry(r.Entry)
		case "id":
			r.ID, ok = d.string()
		case "deadline":
			r.Deadline, ok = d.timePtr()
		case "peak_memory_mib":
			r.PeakMemoryMiB, ok = d.uint(math.MaxUint64)
		}
		return ok
	})
}

func (d *scanner) entry(e *Entry) bool {
	return d.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "lease":
			ok = d.lease(e)
		case "start_time":
			e.StartTime, ok = d.uint(math.MaxUint64)
		case "deadline":
			e.Deadline, ok = d.timePtr()
		case "ttl_ns":
			e.TTLNanos, ok = d.int(math.MaxInt64)
		case "share":
			e.Share, ok = d.string()
		case "slurm_cgroup":
			e.SlurmCgroup, ok = d.string()
		}
		return ok
	})
}

// lease reads e.Lease: the fields AppendLease writes.
func (d *scanner) lease(e *Entry) bool {
	l := &e.Lease
	return d.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "id":
			l.ID, ok = d.string()
		case "gpu":
			ok = d.object(func(key []byte) bool {
				var ok bool
				switch string(key) {
				case "index":
					var v int64
					v, ok = d.int(math.MaxInt)
					l.GPU.Index = int(v)
				case "uuid":
					l.GPU.UUID, ok = d.string()
				}
				return ok
			})
		case "instance":
			var v int64
			v, ok = d.int(math.MaxInt)
			l.Instance = int(v)
		case "units":
			l.Units, ok = d.ints()
		case "owner":
			ok = d.owner(e)
		case "created":
			ok = d.time(&l.Created)
		case "expires":
			l.Expires, ok = d.timePtr()
		case "ttl":
			l.TTL, ok = d.string()
		case "binding":
			l.Binding, ok = d.string()
		case "preemptible":
			l.Preemptible, ok = d.bool()
		case "reservation":
			l.Reservation, ok = d.string()
		case "task":
			l.Task, ok = d.string()
		case "memory_mib":
			l.MemoryMiB, ok = d.uint(math.MaxUint64)
		case "env":
			l.Env, ok = d.stringMap()
		}
		return ok
	})
}

func (d *scanner) owner(e *Entry) bool {
	o := &e.Lease.Owner
	return d.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "uid":
			var v uint64
			v, ok = d.uint(math.MaxUint32)
			o.UID = uint32(v)
		case "gid":
			var v uint64
			v, ok = d.uint(math.MaxUint32)
			o.GID = uint32(v)
		case "pid":
			var v int64
			v, ok = d.int(math.MaxInt)
			o.PID = int(v)
		case "groups":
			ok = d.array(func() bool {
				v, ok := d.uint(math.MaxUint32)
				o.Groups = append(o.Groups, uint32(v))
				return ok
			})
			if ok && o.Groups == nil {
				o.Groups = []uint32{}
			}
		}
		return ok
	})
}

// object reads an object, calling member for each key with the scanner at
// its value; member reports false for a key it does not know. A key given
// twice is refused: encoding/json would merge the two.
func (d *scanner) object(member func(key []byte) bool) bool {
	if !d.skip('{') {
		return false
	}
	if d.skip('}') {
		return true
	}
	// Keys are compared as they stand in b: no copies.
	var seen [16][]byte
	n := 0
	for {
		key, ok := d.rawString()
		if !ok || !d.skip(':') || n == len(seen) {
			// n: more members than any object the encoder writes.
			return false
		}
		for _, k := range seen[:n] {
			if bytes.Equal(k, key) {
				return false
			}
		}
		seen[n] = key
		n++
		if !member(key) {
			return false
		}
		if d.skip('}') {
			return true
		}
		if !d.skip(',') {
			return false
		}
	}
}

// array reads an array, calling elem with the scanner at each element.
func (d *scanner) array(elem func() bool) bool {
	if !d.skip('[') {
		return false
	}
	if d.skip(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.skip(']') {
			return true
		}
		if !d.skip(',') {
			return false
		}
	}
}

// ints reads an array of ints: nil for null, as encoding/json reads it, and
// an empty slice, not nil, for [].
func (d *scanner) ints() ([]int, bool) {
	if d.null() {
		return nil, true
	}
	// Not nil, as encoding/json makes it; a lease has a unit or two.
	out := make([]int, 0, 2)
	ok := d.array(func() bool {
		v, ok := d.int(math.MaxInt)
		out = append(out, int(v))
		return ok
	})
	return out, ok
}

// stringMap reads an object of strings: nil for null. A key given twice
// takes its last value, as encoding/json does.
func (d *scanner) stringMap() (map[string]string, bool) {
	if d.null() {
		return nil, true
	}
	if !d.skip('{') {
		return nil, false
	}
	m := map[string]string{}
	if d.skip('}') {
		return m, true
	}
	for {
		k, ok := d.string()
		if !ok || !d.skip(':') {
			return nil, false
		}
		v, ok := d.string()
		if !ok {
			return nil, false
		}
		m[k] = v
		if d.skip('}') {
			return m, true
		}
		if !d.skip(',') {
			return nil, false
		}
	}
}

func (d *scanner) skip(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *scanner) literal(s string) bool {
	if string(d.b[d.i:min(d.i+len(s), len(d.b))]) == s {
		d.i += len(s)
		return true
	}
	return false
}

func (d *scanner) null() bool { return d.literal("null") }

func (d *scanner) bool() (bool, bool) {
	if d.literal("true") {
		return true, true
	}
	return false, d.literal("false")
}

// rawString reads a string without escapes or control characters, and
// returns its bytes between the quotes. Text that is not valid UTF-8 is
// refused: encoding/json would replace its bytes.
func (d *scanner) rawString() ([]byte, bool) {
	if !d.skip('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, ascii || utf8.Valid(s)
		case c < 0x20 || c == '\\':
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func (d *scanner) string() (string, bool) {
	s, ok := d.rawString()
	return string(s), ok
}

// time reads a time as encoding/json does: its literal, quotes and all, to
// time.Time's UnmarshalJSON.
func (d *scanner) time(t *time.Time) bool {
	start := d.i
	if _, ok := d.rawString(); !ok {
		return false
	}
	return t.UnmarshalJSON(d.b[start:d.i]) == nil
}

func (d *scanner) timePtr() (*time.Time, bool) {
	t := new(time.Time)
	return t, d.time(t)
}

// uint reads an integer of at most most. Whatever encoding/json would
// refuse for an unsigned field, or read otherwise (a sign, a fraction, an
// exponent, leading zeros, too large), is refused.
func (d *scanner) uint(most uint64) (uint64, bool) {
	start := d.i
	var v uint64
	for ; d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9'; d.i++ {
		c := uint64(d.b[d.i] - '0')
		if v > (most-c)/10 {
			return 0, false
		}
		v = v*10 + c
	}
	n := d.i - start
	return v, n > 0 && (n == 1 || d.b[start] != '0')
}

// int reads an integer between -most-1 and most.
func (d *scanner) int(most int64) (int64, bool) {
	if !d.skip('-') {
		v, ok := d.uint(uint64(most))
		return int64(v), ok
	}
	v, ok := d.uint(uint64(most) + 1)
	return int64(-v), ok
}
