// Package jsonenc appends JSON as encoding/json writes it, for the few values
// gpuletd encodes on every change (leases, journal records, the snapshot),
// where encoding/json's reflection costs several times more than the bytes.
// Its users hold their encoders to encoding/json's bytes with fuzz tests, and
// leave to encoding/json whatever these helpers do not cover.
package jsonenc

import (
	"encoding/json"
	"strconv"
	"time"
)

// String appends s quoted as encoding/json quotes it. Text that needs no
// escape, as ids, uuids, paths and numbers, is copied as it is; anything else
// (quotes, control bytes, HTML characters, non-ASCII) is left to
// encoding/json, whose rules are the contract.
func String(b []byte, s string) []byte {
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

// OptionalString appends key and s unless s is empty (omitempty).
func OptionalString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return String(append(b, key...), s)
}

// TimeOK says whether encoding/json encodes t (it refuses years outside
// 0–9999).
func TimeOK(t time.Time) bool {
	y := t.Year()
	return y >= 0 && y <= 9999
}

// Time appends t as time.Time's MarshalJSON does; t must be TimeOK.
func Time(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// Ints appends a list of integers; nil is null, as encoding/json has it.
func Ints[T ~int | ~int64 | ~uint32 | ~uint64](b []byte, list []T) []byte {
	if list == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, v := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, v)
	}
	return append(b, ']')
}

func appendInt[T ~int | ~int64 | ~uint32 | ~uint64](b []byte, v T) []byte {
	if v < 0 {
		return strconv.AppendInt(b, int64(v), 10)
	}
	return strconv.AppendUint(b, uint64(v), 10)
}
