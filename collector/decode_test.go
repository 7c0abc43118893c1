package collector

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/collector/cluster"
	"github.com/gpulet/gpulet/placement"
)

// body encodes s, after edit has changed the decoded JSON object (so that
// tests can make bodies api.Snapshot cannot express).
func body(t testing.TB, s *api.Snapshot, edit func(m map[string]any)) []byte {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if edit == nil {
		return b
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	return b
}

func gpu0(m map[string]any) map[string]any { return m["gpus"].([]any)[0].(map[string]any) }

func TestDecodeSnapshot(t *testing.T) {
	tests := []struct {
		name string
		edit func(m map[string]any)
		raw  string
		// want is a part of the error message; "" for a valid body.
		want string
	}{
		{name: "valid"},
		{name: "degraded node", edit: func(m map[string]any) { m["state"] = "degraded"; m["reason"] = "ledger" }},
		{name: "wrong schema", edit: func(m map[string]any) { m["schema"] = "gpulet.snapshot/v0" }, want: "field schema"},
		{name: "no schema", edit: func(m map[string]any) { delete(m, "schema") }, want: "field schema"},
		{name: "no node", edit: func(m map[string]any) { delete(m, "node") }, want: "field node"},
		{name: "no boot_id", edit: func(m map[string]any) { m["boot_id"] = "" }, want: "field boot_id"},
		{name: "seq 0", edit: func(m map[string]any) { m["seq"] = 0 }, want: "field seq"},
		{name: "seq negative", edit: func(m map[string]any) { m["seq"] = -1 }, want: "field seq"},
		{name: "seq a string", edit: func(m map[string]any) { m["seq"] = "7" }, want: "field seq"},
		{name: "no state", edit: func(m map[string]any) { delete(m, "state") }, want: "field state"},
		{name: "unknown state", edit: func(m map[string]any) { m["state"] = "sleeping" }, want: "field state"},
		{name: "negative units_total", edit: func(m map[string]any) { m["units_total"] = -1 }, want: "field units_total"},
		{name: "negative units_free", edit: func(m map[string]any) { m["units_free"] = -2 }, want: "field units_free"},
		{name: "negative units_reserved", edit: func(m map[string]any) { m["units_reserved"] = -3 }, want: "field units_reserved"},
		{name: "negative gpu index", edit: func(m map[string]any) { gpu0(m)["index"] = -1 }, want: "field gpus[0].index"},
		{name: "duplicate gpu index", edit: func(m map[string]any) { m["gpus"].([]any)[1].(map[string]any)["index"] = 0 }, want: "field gpus[1].index"},
		{name: "negative gpu units_used", edit: func(m map[string]any) { gpu0(m)["units_used"] = -1 }, want: "field gpus[0].units_used"},
		{name: "negative gpu units_free", edit: func(m map[string]any) { gpu0(m)["units_free"] = -1 }, want: "field gpus[0].units_free"},
		{name: "negative gpu units_offline", edit: func(m map[string]any) { gpu0(m)["units_offline"] = -1 }, want: "field gpus[0].units_offline"},
		{name: "negative instance clients", edit: func(m map[string]any) {
			gpu0(m)["instances"] = []any{map[string]any{"state": "running", "clients": -3, "clients_max": 4}}
		}, want: "field gpus[0].instances[0].clients"},
		{name: "negative instance units_free", edit: func(m map[string]any) {
			gpu0(m)["instances"] = []any{map[string]any{"state": "running", "units_free": -1}}
		}, want: "field gpus[0].instances[0].units_free"},
		{name: "negative utilization", edit: func(m map[string]any) { gpu0(m)["utilization_pct"] = -5 }, want: "field gpus[0].utilization_pct"},
		{name: "negative memory total", edit: func(m map[string]any) { gpu0(m)["memory_total_mib"] = -1 }, want: "field gpus.memory_total_mib"},
		{name: "negative memory used", edit: func(m map[string]any) { gpu0(m)["memory_used_mib"] = -1 }, want: "field gpus.memory_used_mib"},
		{name: "seq past uint64", raw: `{"schema":"gpulet.snapshot/v1","node":"n","boot_id":"b","seq":18446744073709551621,"state":"working"}`, want: "field seq"},
		{name: "memory past uint64", edit: func(m map[string]any) { gpu0(m)["memory_total_mib"] = json.Number("18446744073709551716") }, want: "memory_total_mib"},
		{name: "units_total past int", edit: func(m map[string]any) { m["units_total"] = json.Number("9223372036854775808") }, want: "field units_total"},
		{name: "unknown gpu state", edit: func(m map[string]any) { gpu0(m)["state"] = "sleeping" }, want: "field gpus[0].state"},
		{name: "no gpu state", edit: func(m map[string]any) { gpu0(m)["state"] = "" }, want: "field gpus[0].state"},
		{name: "NUL in node", edit: func(m map[string]any) { m["node"] = "n\x00" }, want: "field node"},
		{name: "escape in node", edit: func(m map[string]any) { m["node"] = "\x1b]0;PWNED\x07" }, want: "field node"},
		{name: "C1 control in gpu name", edit: func(m map[string]any) { gpu0(m)["name"] = "A\u009bB" }, want: "field gpus[0].name"},
		{name: "control in boot_id", edit: func(m map[string]any) { m["boot_id"] = "b\n" }, want: "field boot_id"},
		{name: "invalid UTF-8", raw: "{\"schema\":\"gpulet.snapshot/v1\",\"node\":\"\xff\",\"boot_id\":\"b\",\"seq\":1,\"state\":\"working\"}", want: "UTF-8"},
		{name: "a field added by a newer gpuletd", edit: func(m map[string]any) { m["colour"] = "blue"; gpu0(m)["memory_bandwidth_gbps"] = 2039 }},
		{name: "not an object", raw: `[1,2]`, want: "field (top level)"},
		{name: "empty", raw: ``, want: "empty body"},
		{name: "truncated", raw: `{"schema":"gpulet.snapshot/v1","node":`, want: "body ends"},
		{name: "not JSON", raw: `{nope}`, want: "not valid JSON"},
		{name: "bad JSON in an unknown field", raw: `{"schema":"gpulet.snapshot/v1","node":"n","boot_id":"b","seq":1,"state":"working","colour":["""""]}`, want: "not valid JSON"},
		{name: "trailing data", raw: "", want: "data after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := []byte(tt.raw)
			if tt.raw == "" && tt.want != "empty body" {
				b = body(t, testSnapshot("n1", "b1", 1, 4, 2), tt.edit)
			}
			if tt.name == "trailing data" {
				b = append(b, []byte(` {}`)...)
			}
			s, err := DecodeSnapshot(b)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("valid snapshot refused: %v", err)
				}
				if s.Node != "n1" || len(s.GPUs) != 2 {
					t.Fatalf("decoded %+v", s)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error with %q", tt.want)
			}
			if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q (bad request: %v); want one with %q", err, errors.Is(err, api.ErrBadRequest), tt.want)
			}
		})
	}
}

// TestWhichBodiesTakeTheFastDecoder: what gpuletd sends, long runs of digits
// included, is decoded by v2; a key in other case, a key twice, a field the
// collector does not know or an escape is left to encoding/json, whose
// matching, last-wins rule, silence on unknown fields and reading of escaped
// times v2 does not share.
func TestWhichBodiesTakeTheFastDecoder(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(m map[string]any)
		fast bool
	}{
		{name: "as sent", edit: nil, fast: true},
		{name: "zero-padded boot id", edit: func(m map[string]any) { m["boot_id"] = "0000000000000000000000000000d889" }, fast: true},
		{name: "node named by a serial", edit: func(m map[string]any) { m["node"] = "n12345678901234567890" }, fast: true},
		// An escape anywhere: encoding/json reads an escaped time as v2 does not.
		{name: "a name with an escape", edit: func(m map[string]any) { m["node"] = `n\"1` }, fast: false},
		{name: "a long number that fits", edit: func(m map[string]any) { m["seq"] = json.Number("12345678901234567890") }, fast: true},
		{name: "a number past its type", edit: func(m map[string]any) { gpu0(m)["memory_total_mib"] = json.Number("18446744073709551616") }, fast: false},
		{name: "a key in upper case", edit: func(m map[string]any) { m["NODE"] = m["node"]; delete(m, "node") }, fast: false},
		{name: "a field of a newer gpuletd", edit: func(m map[string]any) { gpu0(m)["memory_bandwidth_gbps"] = 2039 }, fast: false},
		// encoding/json matches ſ (U+017F) to s, as Unicode case folding does.
		{name: "a key that folds to a field's", edit: func(m map[string]any) { m["ſeq"] = m["seq"]; delete(m, "seq") }, fast: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := body(t, testSnapshot("n1", "b1", 1, 4, 2), tt.edit)
			var s api.Snapshot
			if err := fastDecode(b, &s); (err == nil) != tt.fast {
				t.Fatalf("fast decoder: %v; want it to take the body: %v", err, tt.fast)
			}
		})
	}
	// A time with an escape: encoding/json hands time.Time the string as
	// written, which it refuses; the fast decoder must not unescape it.
	for _, raw := range []string{
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":1,"state":"working","time":"2026-11-27T03:00:00\u005a"}`,
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":1,"state":"working","upstreams":[{"last_success":"2026-11-27T03:00:00\u005a"}]}`,
	} {
		if s, err := DecodeSnapshot([]byte(raw)); err == nil {
			t.Errorf("%s: accepted (time %v), which encoding/json refuses", raw, s.Time)
		}
	}
	twice := []byte(`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":1,"state":"working","node":"z"}`)
	var s api.Snapshot
	if err := fastDecode(twice, &s); err == nil {
		t.Fatal("the fast decoder took a key twice; encoding/json keeps the last")
	}
	if got, err := DecodeSnapshot(twice); err != nil || got.Node != "z" {
		t.Fatalf("a key twice: %+v, %v; want the last, as encoding/json reads it", got, err)
	}
}

// FuzzDecodeSnapshot: no body makes the decoder panic, and whatever it
// accepts is a snapshot the store can apply, query, model and place on.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(body(f, testSnapshot("n1", "b1", 1, 4, 2), nil))
	f.Add(body(f, withInstances(testSnapshot("n3", "b3", 1, 4, 2)), nil))
	f.Add(body(f, testSnapshot("n2", "b2", 9, 0, 0), nil))
	f.Add([]byte(`{"schema":"gpulet.snapshot/v1","node":"x","boot_id":"y","seq":1,"state":"working","gpus":[{"index":-1}]}`))
	f.Add([]byte(`{"seq":-1}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	// Where two JSON decoders are most likely to part ways.
	base := `"schema":"gpulet.snapshot/v1","boot_id":"y","seq":1,"state":"working"`
	for _, tricky := range []string{
		`{"node":"x",` + base + `,"node":"z"}`, // a key twice
		`{"NODE":"x",` + base + `}`,            // a key in other case
		`{"node":"x\u0000",` + base + `}`,      // an escaped NUL
		"{\"node\":\"\xff\xfe\"," + base + "}", // invalid UTF-8
		`{"node":"\ud800",` + base + `}`,       // a lone surrogate
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":1e0,"state":"working"}`,
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":18446744073709551616,"state":"working"}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"extra":1}]}`,
		`{"node":"x",` + base + `,"extra":["""""]}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"extra":{"a":[1,}}]}`,
		`{"node":"x",` + base + `,}`,
		`{"node":"x",` + base + `} `,
		`{"node":"x",` + base + `}x`,
		"\ufeff{\"node\":\"x\"," + base + "}",
		`{"node":"x",` + base + `,"gpus":[{"index":0,"units_free":1.5}]}`,
		// Keys that fold to a field's name in Unicode, and escaped times.
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","ſeq":1,"state":"working"}`,
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":1,"\u212aey":1,"state":"working"}`,
		`{"node":"x",` + base + `,"time":"2026-11-27T03:00:00\u005a"}`,
		`{"node":"x",` + base + `,"time":"2026-11-27T03:00:00Z","upstreams":[{"last_success":"2026-11-27T03:00:0\u0030Z"}]}`,
		`{"node":"x",` + base + `,"gpus":null,"view":null,"upstreams":[{}]}`,
		// Numbers past their type (a decoder once wrapped them around).
		`{"node":"x","schema":"gpulet.snapshot/v1","boot_id":"y","seq":18446744073709551621,"state":"working"}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"state":"working","memory_total_mib":18446744073709551716}]}`,
		`{"node":"x",` + base + `,"units_total":9223372036854775808}`,
		`{"node":"x",` + base + `,"units_free":-9223372036854775809}`,
		`{"node":"x",` + base + `,"gpus":[{"index":9223372036854775817,"state":"working"}]}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"state":"working","memory_used_mib":18446744073709551615}]}`,
		// Long runs of digits in strings, around escapes, and in numbers.
		`{"node":"1234567890123456789012",` + base + `}`,
		`{"node":"x\\\"1234567890123456789012",` + base + `,"units_total":12345678901234567890}`,
		`{"node":"x\\",` + base + `,"units_total":12345678901234567890}`,
		// Names and enums a table reader must not be shown.
		`{"node":"x\u001b]0;PWNED\u0007",` + base + `}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"state":"sleeping"}]}`,
		`{"node":"x",` + base + `,"gpus":[{"index":0,"state":"working","name":"A\u0085B"}]}`,
		// Unit numbers at the end of int, which a model's range of free
		// units once wrapped around.
		`{"node":"x",` + base + `,"gpus":[{"index":0,"state":"working","eligible":true,"units_total":2,"units_free":2,"instances":[{"instance":0,"state":"off","units":[9223372036854775806,9223372036854775807],"units_free":2}]}]}`,
	} {
		f.Add([]byte(tricky))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// The fast decoder accepts what encoding/json accepts, as the same
		// snapshot, and nothing else.
		var fast api.Snapshot
		fastErr := fastDecode(b, &fast)
		strict, strictErr := strictDecode(b)
		if fastErr == nil && strictErr == nil && !reflect.DeepEqual(&fast, strict) {
			t.Fatalf("%q: the decoders disagree:\n%+v\n%+v", b, fast, *strict)
		}
		if fastErr == nil && strictErr != nil && validate(&fast) == nil {
			t.Fatalf("%q: the fast decoder accepted what encoding/json refuses: %v", b, strictErr)
		}
		s, err := DecodeSnapshot(b)
		if err != nil {
			if !errors.Is(err, api.ErrBadRequest) {
				t.Fatalf("error that is not a bad request: %v", err)
			}
			return
		}
		if s.Node == "" || s.BootID == "" || s.Seq == 0 {
			t.Fatalf("accepted a snapshot without identity: %+v", s)
		}
		texts := []string{s.Node, s.BootID}
		for _, g := range s.GPUs {
			texts = append(texts, g.Name, g.UUID)
		}
		for _, v := range texts {
			if checkText(v) != nil {
				t.Fatalf("accepted the unprintable name %q", v)
			}
		}
		st := NewStore(DefaultStaleAfter, nil)
		st.takeChanged() // placements asked: each record comes with its model
		if st.Apply(s) != Applied {
			t.Fatal("first snapshot of a node not applied")
		}
		if got := len(st.Table(Query{}).Rows); got != len(s.GPUs) {
			t.Fatalf("%d rows for %d GPUs", got, len(s.GPUs))
		}
		p := newPlacer(placement.Frag)
		for _, r := range []placement.Request{{Units: 1}, {GPUs: 1}} {
			done, err := p.asking.take("fuzz", true)
			if err != nil {
				t.Fatal(err)
			}
			// Placed or refused (no node fits): either, without a panic.
			_, _, _ = p.place(context.Background(), st, cluster.Request{Request: r}, 3, "", "fuzz")
			done()
		}
	})
}

func TestDecodeBounds(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		field  string
		change func(s *api.Snapshot)
	}{
		{"node", func(s *api.Snapshot) { s.Node = long }},
		{"boot_id", func(s *api.Snapshot) { s.BootID = long }},
		{"version", func(s *api.Snapshot) { s.Version = long }},
		{"commit", func(s *api.Snapshot) { s.Commit = "\x1b[2J" }},
		{"config_error", func(s *api.Snapshot) { s.ConfigError = strings.Repeat("x", 4097) }},
		{"gpus[0].name", func(s *api.Snapshot) { s.GPUs[0].Name = long }},
		{"gpus[0].uuid", func(s *api.Snapshot) { s.GPUs[0].UUID = long }},
		{"gpus[0].instances[1].state", func(s *api.Snapshot) {
			s.GPUs[0].Instances = []api.Instance{{State: api.InstanceRunning}, {Instance: 1, State: long}}
		}},
		{"gpus", func(s *api.Snapshot) {
			for i := range MaxGPUs {
				s.GPUs = append(s.GPUs, api.GPU{Index: i + 1})
			}
		}},
	} {
		s := testSnapshot("n", "b", 1, 4, 1)
		tc.change(s)
		b, _ := json.Marshal(s)
		if _, err := DecodeSnapshot(b); err == nil || !strings.Contains(err.Error(), "field "+tc.field+":") {
			t.Errorf("%s too large: %v", tc.field, err)
		}
	}
}
