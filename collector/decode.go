package collector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/gpulet/gpulet/api"
)

// MaxSnapshotBody is the largest snapshot body accepted. A node of 8 GPUs
// sends about 3 KiB; the limit leaves room for many GPUs and instances
// while bounding what one request can make the collector hold.
const MaxSnapshotBody = 1 << 20

// DecodeSnapshot decodes and validates a snapshot body (docs/design.md §8).
// Fields the collector does not know are ignored: schema v1 grows by added
// fields (a newer gpuletd's GPU figures, reservations), and a cluster upgraded
// node by node must not have its newer nodes' snapshots refused. Wrong types,
// missing or bad required fields and trailing data are refused. Every error
// wraps api.ErrBadRequest and names the field at fault.
//
// Bodies are decoded with go-json-experiment/json (encoding/json/v2 to be),
// two to three times as fast as encoding/json, which is most of what
// ingesting 10,000 snapshots a second costs. It checks the syntax as it
// decodes and uses no unsafe memory, so a body from the network needs no
// check before it. A body it refuses is decoded again with encoding/json,
// which decides: its errors name the field at fault, and it accepts what v2
// is told to refuse or is not given (a key twice, a key in other case, a
// field the collector does not know, an escape). A fuzz test holds the two
// to accepting the same bodies as the same snapshots.
func DecodeSnapshot(body []byte) (*api.Snapshot, error) {
	if !utf8.Valid(body) {
		// encoding/json would take invalid bytes as U+FFFD: a name the
		// sender did not write.
		return nil, api.Errorf(api.ErrBadRequest, "snapshot: not valid UTF-8")
	}
	var s api.Snapshot
	if fastDecode(body, &s) != nil {
		return strictDecode(body)
	}
	if err := validate(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// fastDecode decodes body into s as strictly as strictDecode, or fails.
// It refuses any key that is not a field's exact name: encoding/json matches
// a key to a field in any case, v2 only in the case of the field's tag, so
// such a key is left to encoding/json, as is a field it does not know (a
// newer gpuletd's), which encoding/json ignores. It also leaves any body with
// an escape to encoding/json: that hands a time its JSON string as written,
// escapes and all, and time.Time refuses an escape (go.dev/issue/47353),
// where v2 unescapes first and would accept "...\u005a". gpuletd writes no
// escapes in a snapshot unless a name needs one, so this costs one fast scan.
func fastDecode(body []byte, s *api.Snapshot) error {
	if bytes.IndexByte(body, '\\') >= 0 {
		return errors.New("an escape: left to encoding/json")
	}
	return jsonv2.Unmarshal(body, s, jsonv2.RejectUnknownMembers(true))
}

// strictDecode decodes and validates body with encoding/json, for its errors.
func strictDecode(body []byte) (*api.Snapshot, error) {
	var s api.Snapshot
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&s); err != nil {
		return nil, decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, api.Errorf(api.ErrBadRequest, "snapshot: data after the JSON object")
	}
	if err := validate(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// decodeError turns encoding/json's errors into messages that name the
// field, as a sender needs to find what it got wrong.
func decodeError(err error) error {
	var typ *json.UnmarshalTypeError
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "(top level)"
		}
		return api.Errorf(api.ErrBadRequest, "snapshot: field %s: cannot take %s as %s", field, typ.Value, typ.Type)
	case errors.As(err, &syn):
		return api.Errorf(api.ErrBadRequest, "snapshot: not valid JSON at byte %d: %v", syn.Offset, syn)
	case errors.Is(err, io.EOF):
		return api.Errorf(api.ErrBadRequest, "snapshot: empty body")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Errorf(api.ErrBadRequest, "snapshot: body ends inside the JSON object")
	}
	return api.Errorf(api.ErrBadRequest, "snapshot: %v", err)
}

// Bounds on what one snapshot may make the collector keep: the names and ids
// of a node and its GPUs, its instances' states, and its count of GPUs.
const (
	maxText = 256
	MaxGPUs = 256
	// maxConfigError bounds config_error, a sentence with a path in it.
	maxConfigError = 4096
)

// checkText refuses what a table reader could not show as it is: invalid
// UTF-8 (a lone surrogate escape decodes to U+FFFD and passes) and control
// characters, NUL, escape sequences and the C1 controls among them.
func checkText(v string) error {
	if !utf8.ValidString(v) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return fmt.Errorf("holds the control character %U", r)
		}
	}
	return nil
}

func validate(s *api.Snapshot) error {
	bad := func(field, format string, args ...any) error {
		return api.Errorf(api.ErrBadRequest, "snapshot: field %s: %s", field, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ name, v string }{{"node", s.Node}, {"boot_id", s.BootID}, {"version", s.Version}, {"commit", s.Commit}} {
		if err := checkText(f.v); err != nil {
			return bad(f.name, "%v", err)
		}
		if len(f.v) > maxText {
			return bad(f.name, "longer than %d bytes", maxText)
		}
	}
	// A failed reload's message names a path and a config line: longer
	// than a name, still bounded.
	if err := checkText(s.ConfigError); err != nil {
		return bad("config_error", "%v", err)
	}
	if len(s.ConfigError) > maxConfigError {
		return bad("config_error", "longer than %d bytes", maxConfigError)
	}
	switch {
	case s.Schema != api.SnapshotSchema:
		return bad("schema", "%q is not %q", s.Schema, api.SnapshotSchema)
	case s.Node == "":
		return bad("node", "missing")
	case s.BootID == "":
		return bad("boot_id", "missing")
	case s.Seq == 0:
		return bad("seq", "missing (seq starts at 1)")
	case len(s.GPUs) > MaxGPUs:
		return bad("gpus", "%d GPUs, more than the %d a node may have", len(s.GPUs), MaxGPUs)
	}
	switch s.State {
	case api.NodeWorking, api.NodeDraining, api.NodeDegraded:
	case "":
		return bad("state", "missing")
	default:
		return bad("state", "%q is not working, draining or degraded", s.State)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"units_total", s.UnitsTotal}, {"units_free", s.UnitsFree}, {"units_reserved", s.UnitsReserved}} {
		if f.v < 0 {
			return bad(f.name, "%d is negative", f.v)
		}
	}
	seen := make(map[int]bool, len(s.GPUs))
	for i := range s.GPUs {
		g := &s.GPUs[i]
		for _, f := range []struct {
			name string
			v    int
		}{
			{"index", g.Index}, {"units_total", g.UnitsTotal}, {"units_used", g.UnitsUsed},
			{"units_free", g.UnitsFree}, {"units_offline", g.UnitsOffline}, {"units_reserved", g.UnitsReserved},
			{"utilization_pct", g.UtilizationPct}, {"max_utilization_pct", g.MaxUtilizationPct},
		} {
			if f.v < 0 {
				return bad(fmt.Sprintf("gpus[%d].%s", i, f.name), "%d is negative", f.v)
			}
		}
		for _, f := range []struct{ name, v string }{{"uuid", g.UUID}, {"name", g.Name}} {
			if len(f.v) > maxText {
				return bad(fmt.Sprintf("gpus[%d].%s", i, f.name), "longer than %d bytes", maxText)
			}
			if err := checkText(f.v); err != nil {
				return bad(fmt.Sprintf("gpus[%d].%s", i, f.name), "%v", err)
			}
		}
		for k := range g.Instances {
			in := &g.Instances[k]
			// The table keeps each instance's state as sent (placements
			// read it); made-up ones are bounded as names are.
			if len(in.State) > maxText {
				return bad(fmt.Sprintf("gpus[%d].instances[%d].state", i, k), "longer than %d bytes", maxText)
			}
			for _, f := range []struct {
				name string
				v    int
			}{{"clients", in.Clients}, {"clients_max", in.ClientsMax}, {"units_free", in.UnitsFree}} {
				if f.v < 0 {
					return bad(fmt.Sprintf("gpus[%d].instances[%d].%s", i, k, f.name), "%d is negative", f.v)
				}
			}
		}
		switch g.State {
		case api.GPUWorking, api.GPUDegraded, api.GPUFailed:
		default:
			return bad(fmt.Sprintf("gpus[%d].state", i), "%q is not working, degraded or failed", g.State)
		}
		if seen[g.Index] {
			return bad(fmt.Sprintf("gpus[%d].index", i), "GPU %d appears twice", g.Index)
		}
		seen[g.Index] = true
	}
	return nil
}
