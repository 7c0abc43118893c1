package journal

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// jsonRecord is body decoded as decodeRecord did before it had a fast path.
func jsonRecord(body []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&r)
	return r, err
}

// recordBodies are the JSON of the golden journal's records.
func recordBodies(tb testing.TB) [][]byte {
	b, err := os.ReadFile("testdata/v2.journal")
	if err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for _, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		out = append(out, line[9:])
	}
	return out
}

// The records a lease engine writes as it runs take the fast path and read
// as encoding/json reads them; those with labels, a pod, a Slurm job or
// escaped text go to encoding/json.
func TestRecordsTheEncoderWritesTakeTheFastPath(t *testing.T) {
	for seed := range uint64(20) {
		h := buildHistory(t, seed)
		for _, line := range bytes.Split(bytes.TrimSuffix(h.text, []byte("\n")), []byte("\n")) {
			var got Record
			if !decodeRecordJSON(line[9:], &got) {
				t.Fatalf("left to encoding/json: %s", line)
			}
			want, err := jsonRecord(line[9:])
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s\nreads as %+v, encoding/json reads %+v (%v)", line, got, want, err)
			}
		}
	}
	for i, body := range recordBodies(t) {
		var got Record
		slow := bytes.Contains(body, []byte(`\`)) || bytes.Contains(body, []byte(`"labels"`)) ||
			bytes.Contains(body, []byte(`"pod"`)) || bytes.Contains(body, []byte(`"slurm"`))
		if ok := decodeRecordJSON(body, &got); ok == slow {
			t.Errorf("record %d, fast path %v: %s", i+1, ok, body)
		}
	}
}

// FuzzRecordDecodeIsWhatJSONMakes holds the fast path of the record decoder
// to encoding/json: what it takes, encoding/json takes too and reads the same.
func FuzzRecordDecodeIsWhatJSONMakes(f *testing.F) {
	for _, body := range recordBodies(f) {
		f.Add(string(body))
	}
	h := buildHistory(f, 3)
	for _, line := range strings.Split(strings.TrimSuffix(string(h.text), "\n"), "\n") {
		f.Add(line[9:])
	}
	for _, s := range []string{
		`{}`, `{"op":"end","id":"l-0123456789abcdef"} `, `{"op":"end","op":"end"}`, `{"OP":"end"}`,
		`{"op":"renew","id":"x","deadline":"2026-11-23T12:00:00Z"}`, `{"op":"end","peak_memory_mib":-1}`,
		`{"op":"end","peak_memory_mib":1e3}`, `{"op":"end","peak_memory_mib":18446744073709551616}`,
		`{"op":"lease","entry":{"lease":{"units":[],"owner":{"groups":[]},"env":{}},"ttl_ns":-9223372036854775808}}`,
		`{"op":"lease","entry":{"lease":{"instance":-0,"env":{"a":"1","a":"2"}}}}`, `{"op":"lease","entry":null}`,
		`{"op":"lease","entry":{"lease":{"owner":{"uid":4294967296}}}}`, `{"op":"ü\xff"}`, `{"op":"\u00e9"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var got Record
		if !decodeRecordJSON([]byte(body), &got) {
			return
		}
		want, err := jsonRecord([]byte(body))
		if err != nil {
			t.Fatalf("took %q, which encoding/json refuses: %v", body, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q reads as\n%+v\nencoding/json reads\n%+v", body, got, want)
		}
	})
}
