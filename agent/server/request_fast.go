package server

import (
	"strconv"

	"github.com/gpulet/gpulet/api"
)

// decodeRequestFast decodes the requests nearly every client sends (a flat
// object of plain strings, whole numbers and booleans, as gpurun and the
// client package write them) without encoding/json's decoder, which costs a
// lease more than its placement. It reports false for anything else (labels,
// escapes, non-ASCII text, null, fractions and exponents, numbers out of
// range, unknown, duplicate or differently spelled keys, trailing data),
// which the caller then decodes with encoding/json, whose answers and
// errors are the contract. A fuzz test holds every request it does decode to
// encoding/json's result for the same bytes.
func decodeRequestFast(b []byte) (api.LeaseRequest, bool) {
	var lr api.LeaseRequest
	d := fastDecoder{b: b}
	d.space()
	if !d.take('{') {
		return lr, false
	}
	d.space()
	if d.take('}') {
		return lr, d.end()
	}
	var seen uint32
	for {
		key, ok := d.plainString()
		if !ok {
			return lr, false
		}
		d.space()
		if !d.take(':') {
			return lr, false
		}
		d.space()
		bit, ok := d.field(&lr, key)
		if !ok || seen&bit != 0 {
			return lr, false
		}
		seen |= bit
		d.space()
		if d.take('}') {
			return lr, d.end()
		}
		if !d.take(',') {
			return lr, false
		}
		d.space()
	}
}

// fastDecoder reads b from i on.
type fastDecoder struct {
	b []byte
	i int
}

// field decodes the value of key into lr and returns the key's bit, for
// telling duplicates; false for a key or value it leaves to encoding/json.
func (d *fastDecoder) field(lr *api.LeaseRequest, key string) (uint32, bool) {
	var ok bool
	switch key {
	case "units":
		lr.Units, ok = d.integer()
		return 1 << 0, ok
	case "pid":
		lr.PID, ok = d.integer()
		return 1 << 1, ok
	case "memory_mib":
		lr.MemoryMiB, ok = d.unsigned()
		return 1 << 2, ok
	case "preemptible":
		lr.Preemptible, ok = d.boolean()
		return 1 << 3, ok
	case "gpu":
		lr.GPU, ok = d.plainString()
		return 1 << 4, ok
	case "pool":
		lr.Pool, ok = d.plainString()
		return 1 << 5, ok
	case "type":
		lr.Type, ok = d.plainString()
		return 1 << 6, ok
	case "min_cc":
		lr.MinCC, ok = d.plainString()
		return 1 << 7, ok
	case "task":
		lr.Task, ok = d.plainString()
		return 1 << 8, ok
	case "reservation":
		lr.Reservation, ok = d.plainString()
		return 1 << 9, ok
	case "ttl":
		lr.TTL, ok = d.plainString()
		return 1 << 10, ok
	case "wait":
		lr.Wait, ok = d.plainString()
		return 1 << 11, ok
	case "gpus":
		lr.GPUs, ok = d.integer()
		return 1 << 12, ok
	}
	return 0, false
}

// space skips JSON whitespace.
func (d *fastDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *fastDecoder) take(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// end says whether only whitespace is left.
func (d *fastDecoder) end() bool {
	d.space()
	return d.i == len(d.b)
}

// plainString reads a string of printable ASCII with no escapes.
func (d *fastDecoder) plainString() (string, bool) {
	if !d.take('"') {
		return "", false
	}
	start := d.i
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			s := string(d.b[start:d.i])
			d.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
		d.i++
	}
	return "", false
}

// digits reads a JSON integer's text: an optional minus, then 0 or digits not
// starting with 0, and no fraction or exponent after them.
func (d *fastDecoder) digits() (string, bool) {
	start := d.i
	d.take('-')
	first := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.i - first
	if n == 0 || (n > 1 && d.b[first] == '0') {
		return "", false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return "", false
		}
	}
	return string(d.b[start:d.i]), true
}

func (d *fastDecoder) integer() (int, bool) {
	s, ok := d.digits()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, strconv.IntSize)
	return int(v), err == nil
}

func (d *fastDecoder) unsigned() (uint64, bool) {
	s, ok := d.digits()
	if !ok || s[0] == '-' {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func (d *fastDecoder) boolean() (bool, bool) {
	switch {
	case d.literal("true"):
		return true, true
	case d.literal("false"):
		return false, true
	}
	return false, false
}

func (d *fastDecoder) literal(word string) bool {
	if len(d.b)-d.i < len(word) || string(d.b[d.i:d.i+len(word)]) != word {
		return false
	}
	d.i += len(word)
	return true
}
