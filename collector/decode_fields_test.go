package collector

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// TestEveryFieldTakesTheFastDecoder: a snapshot with every field of
// api.Snapshot set, at every depth, is decoded by v2 as encoding/json decodes
// it. The fast decoder refuses keys that are no field's exact name, so a
// field whose key it did not know would send every snapshot that has it to
// the slow decoder.
func TestEveryFieldTakesTheFastDecoder(t *testing.T) {
	var s api.Snapshot
	fill(reflect.ValueOf(&s).Elem(), 0)
	b, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	var fast api.Snapshot
	if err := fastDecode(b, &fast); err != nil {
		t.Fatalf("the fast decoder refused a snapshot with every field set: %v\n%s", err, b)
	}
	var strict api.Snapshot
	if err := json.Unmarshal(b, &strict); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fast, strict) {
		t.Fatalf("the decoders disagree:\n%+v\n%+v", fast, strict)
	}
}

// fill sets every field of v that JSON carries to a value other than its
// zero: one element in every slice and map, a value behind every pointer.
func fill(v reflect.Value, depth int) {
	if depth > 8 {
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), depth+1)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	}
}
