package cli

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// hostile is what an upstream answered in the review: a terminal title
// change and a screen clear, with a C1 CSI, a bidirectional override and a
// byte that is not UTF-8 besides.
const hostile = "\x1b]0;PWNED\x07\x1b[2J\u009b31m\u202eevil\xff\x7f"

// safe reports whether out holds nothing a terminal acts on, but newlines.
func safe(out string) bool {
	if !utf8.ValidString(out) {
		return false
	}
	for _, r := range out {
		if r != '\n' && unprintable(r) {
			return false
		}
	}
	return true
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":       "plain text",
		"":                 "",
		"Müller GPU 😀":     "Müller GPU 😀",
		"tab\there":        `tab\x09here`,
		"\x1b[2J":          `\x1b[2J`,
		"a\nb":             `a\x0ab`,
		"bell\x07":         `bell\x07`,
		"\u009b31m":        `\u009b31m`,
		"\u202eabc":        `\u202eabc`,
		"bad\xffbyte":      `bad\xffbyte`,
		"del\x7f":          `del\x7f`,
		"\u2066isolate":    `\u2066isolate`,
		"zero\x00byte":     `zero\x00byte`,
		"half \xe2\x82 ok": `half \xe2\x82 ok`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzPrintable(f *testing.F) {
	for _, s := range []string{hostile, "ok", "\xe2\x82", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if out := Printable(s); !safe(out) || strings.Contains(out, "\n") {
			t.Fatalf("Printable(%q) = %q", s, out)
		}
		b, _ := json.Marshal(s)
		out := printableJSON(b)
		var back string
		if !safe(string(out)) || json.Unmarshal(out, &back) != nil {
			t.Fatalf("printableJSON(%q) = %q", b, out)
		}
		var want string
		json.Unmarshal(b, &want)
		if back != want {
			t.Fatalf("printableJSON changed the value: %q, want %q", back, want)
		}
	})
}

// Every CLI output of text a peer, an upstream or another user chose is
// made printable: node and GPU names, reasons, instance and GPU errors,
// reservation names, an upstream's URL and last error, lease tasks and ids,
// error messages from gpuletd, and --json output.
func TestHostileTextIsEscaped(t *testing.T) {
	uid := uint32(1000)
	s := &api.Snapshot{Node: "n" + hostile, State: api.NodeDegraded, Reason: hostile, Backend: api.BackendNVML, MPS: "on",
		GPUs: []api.GPU{{Index: 0, UUID: "GPU-" + hostile, Name: hostile, State: api.GPUFailed, Error: hostile,
			Instances: []api.Instance{{State: "down", Error: hostile, UID: &uid}}}},
		Reservations: []api.ReservationStatus{{Name: hostile, State: api.ReservationPending}, {Name: hostile, State: "active"}},
		View:         &api.ViewStatus{Error: hostile},
		Upstreams:    []api.UpstreamStatus{{URL: "http://x/" + hostile, Failures: 1, LastError: "HTTP 500: " + hostile}},
	}
	var b bytes.Buffer
	WriteStatus(&b, s)
	WriteGPUs(&b, &api.GPUList{GPUs: s.GPUs})
	WriteLeases(&b, []api.Lease{{ID: "l-" + hostile, Task: hostile, Units: []int{1}}})
	WriteReservations(&b, []api.Reservation{{ReservationStatus: api.ReservationStatus{Name: hostile}}})
	WriteProfiles(&b, &api.ProfileList{Profiles: []api.TaskProfile{{Task: hostile, Models: []api.ModelRunTime{{Model: hostile, Seconds: 1}}}}})
	b.WriteString(describe(&client.Client{}, api.Errorf(api.ErrNotFound, "no lease %q", hostile)) + "\n")
	b.WriteString(describe(&client.Client{}, api.Errorf(api.ErrNotFound, "no lease %s", hostile)) + "\n")
	if !safe(b.String()) {
		t.Fatalf("the CLI printed what a terminal acts on:\n%q", b.String())
	}
	if !strings.Contains(b.String(), `\x1b]0;PWNED\x07`) || !strings.Contains(b.String(), "failing (1 in a row): HTTP 500: ") {
		t.Fatalf("the hostile text is not shown escaped:\n%s", b.String())
	}

	var j bytes.Buffer
	if err := writeJSON(&j, s); err != nil {
		t.Fatal(err)
	}
	var back api.Snapshot
	if !safe(j.String()) || json.Unmarshal(j.Bytes(), &back) != nil {
		t.Fatalf("--json printed what a terminal acts on, or no JSON:\n%q", j.String())
	}
	want := *s
	raw, _ := json.Marshal(&want)
	json.Unmarshal(raw, &want) // the not-UTF-8 byte becomes U+FFFD, as in any JSON
	if !reflect.DeepEqual(back.Upstreams, want.Upstreams) || back.Node != want.Node {
		t.Fatalf("--json changed the values:\n%+v\n%+v", back.Upstreams, want.Upstreams)
	}
}
