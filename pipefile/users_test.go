package pipefile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestUsersRoundTrip(t *testing.T) {
	b, err := EncodeUsers(Users{PID: 7, GPUs: map[string][][]uint32{"GPU-a": {{1003, 1001}, nil}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"schema":"gpulet.users/v1","pid":7,"gpus":{"GPU-a":[[1001,1003],null]}}` + "\n"; string(b) != want {
		t.Fatalf("encoded %s, want %s", b, want)
	}
	u, err := DecodeUsers(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		uuid string
		k    int
		want string
	}{{"GPU-a", 0, "[1001 1003]"}, {"GPU-a", 1, "[]"}, {"GPU-a", 2, "[]"}, {"GPU-a", -1, "[]"}, {"GPU-b", 0, "[]"}} {
		if got := fmt.Sprint(u.Of(tc.uuid, tc.k)); got != tc.want {
			t.Errorf("Of(%s, %d) = %s, want %s", tc.uuid, tc.k, got, tc.want)
		}
	}
	var none *Users
	if none.Of("GPU-a", 0) != nil {
		t.Fatal("a nil Users names users")
	}
}

func TestDecodeUsersRefuses(t *testing.T) {
	for in, want := range map[string]string{
		`{`:                                    "malformed users file",
		`{"schema":"gpulet.users/v9","pid":1}`: `schema "gpulet.users/v9"`,
		`{"schema":"gpulet.users/v1","pid":0}`: "pid 0",
		`{"schema":"gpulet.users/v1","pid":1,"gpus":{"a":[[-1]]}}`:     "malformed users file",
		`{"schema":"gpulet.users/v1","pid":1,"gpus":{"a":[["1001"]]}}`: "malformed users file",
	} {
		if _, err := DecodeUsers([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeUsers(%s): %v, want %q", in, err, want)
		}
	}
}

func FuzzDecodeUsers(f *testing.F) {
	f.Add([]byte(`{"schema":"gpulet.users/v1","pid":7,"gpus":{"GPU-a":[[1001,1003],null]}}`))
	f.Add([]byte(`{"schema":"gpulet.users/v1","pid":1,"gpus":{}}`))
	f.Add([]byte(`{"schema":"gpulet.users/v1","pid":7,"gpus":{"GPU-a":[[1001],null]},"surplus":{"GPU-a":[null,[1003,1002]]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeUsers(b)
		if err != nil {
			return
		}
		// What decodes encodes, and decodes again to the same.
		again, err := EncodeUsers(*u)
		if err != nil {
			t.Fatal(err)
		}
		v, err := DecodeUsers(again)
		if err != nil || fmt.Sprint(*v) != fmt.Sprint(*u) {
			t.Fatalf("%s decoded to %+v, encoded to %s, decoded to %+v (%v)", b, u, again, v, err)
		}
	})
}

func TestReadUsers(t *testing.T) {
	run := t.TempDir()
	os.MkdirAll(UnitsRoot(run), 0o755)
	path := filepath.Join(UnitsRoot(run), UsersFile)
	if u, err := ReadUsers(run); u != nil || err != nil {
		t.Fatalf("no file: %v, %v", u, err)
	}
	write := func(pid int) {
		b, _ := EncodeUsers(Users{PID: pid, GPUs: map[string][][]uint32{"GPU-a": {{1001}}}})
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(os.Getpid())
	if u, err := ReadUsers(run); err != nil || fmt.Sprint(u.Of("GPU-a", 0)) != "[1001]" {
		t.Fatalf("live writer: %v, %v", u, err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	write(gone.Process.Pid)
	if u, err := ReadUsers(run); u != nil || err != nil {
		t.Fatalf("a file whose writer is gone: %v, %v", u, err)
	}
	os.WriteFile(path, []byte("{"), 0o644)
	if _, err := ReadUsers(run); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a malformed file: %v", err)
	}
}

// TestUsersSurplus: the surplus of an instance reads back sorted, and one the
// file does not name is nobody.
func TestUsersSurplus(t *testing.T) {
	b, err := EncodeUsers(Users{PID: 7, GPUs: map[string][][]uint32{"GPU-a": {{1001}, nil}}, Surplus: map[string][][]uint32{"GPU-a": {nil, {1003, 1002}}}})
	if err != nil {
		t.Fatal(err)
	}
	u, err := DecodeUsers(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(u.SurplusOf("GPU-a", 1), u.SurplusOf("GPU-a", 0), u.SurplusOf("GPU-b", 0), u.SurplusOf("GPU-a", 2)); got != "[1002 1003] [] [] []" {
		t.Fatalf("surplus %s", got)
	}
	var none *Users
	if none.SurplusOf("GPU-a", 1) != nil {
		t.Fatal("a nil file names a surplus")
	}
}
