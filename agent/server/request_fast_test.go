package server

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
)

// The requests clients send are decoded without encoding/json, and anything
// out of the ordinary is left to it.
func TestDecodeRequestFastTakesWhatClientsSend(t *testing.T) {
	for _, lr := range []api.LeaseRequest{
		{Units: 1, TTL: "1m0s"},
		{Units: 2, GPU: "GPU-0123", Type: "A100-80GB", MemoryMiB: 4096, Task: "train", Wait: "30s"},
		{Units: 1, Pool: "ml", MinCC: "8.0", Reservation: "wf1", Preemptible: true},
		{Units: 1, PID: 4242},
	} {
		b, err := json.Marshal(lr)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeRequestFast(b)
		if !ok || !reflect.DeepEqual(got, lr) {
			t.Errorf("fast decode of %s: %+v, %v", b, got, ok)
		}
	}
	for _, body := range []string{
		`{"units":1,"labels":{"k":"v"}}`, `{"units":1,"task":"a\"b"}`, `{"units":1,"task":"ü"}`, `{"Units":1}`,
		`{"units":1,"units":2}`, `{"units":1.0}`, `{"units":1e2}`, `{"units":01}`, `{"units":null}`, `{"units":1} x`,
		`{"units":1,}`, `{"units":99999999999999999999}`, `{"memory_mib":-1}`, `{"preemptible":"true"}`, `{"x":1}`, `[1]`, ``,
	} {
		if got, ok := decodeRequestFast([]byte(body)); ok {
			t.Errorf("fast decode took %s as %+v; it is encoding/json's to answer", body, got)
		}
	}
}

// FuzzDecodeRequestFastIsWhatJSONMakes holds every request the fast path
// decodes to encoding/json's decoding of the same bytes, checks and errors
// included.
func FuzzDecodeRequestFastIsWhatJSONMakes(f *testing.F) {
	for _, s := range []string{
		`{"units":1,"ttl":"1m0s"}`, ` { "units" : 2 , "gpu":"GPU-x" ,"memory_mib":18446744073709551615}` + "\n",
		`{"units":-0,"pid":-9223372036854775808}`, `{"preemptible":true,"wait":"1h","min_cc":"8.9"}`, `{}`, `{"units":0}`,
		`{"units":1,"pid":1,"ttl":"1s"}`, `{"units":1,"task":"\u0041"}`, `{"units":1,"type":"a\tb"}`, `{"units":1}{}`,
		`{"gpus":2,"ttl":"1m"}`, `{"gpus":1,"units":1}`, `{"gpus":-1,"gpu":"0"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lr, ok := decodeRequestFast([]byte(body))
		if !ok {
			return
		}
		fast := lease.Request{LeaseRequest: lr}
		fastErr := validate(&fast)
		slow, slowErr := decodeRequestJSON([]byte(body))
		if (fastErr == nil) != (slowErr == nil) || fastErr != nil && fastErr.Error() != slowErr.Error() {
			t.Fatalf("%q: fast decode says %v, encoding/json %v", body, fastErr, slowErr)
		}
		if fastErr == nil && !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast decode %+v, encoding/json %+v", body, fast, slow)
		}
	})
}
