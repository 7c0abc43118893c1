package api

import (
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// errorRow is a row of docs/api.md's table of error codes: | `code` | status | when |.
var errorRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9]{3}) \\|")

// TestErrorTableMatchesCodes holds docs/api.md's table of error codes, the
// users' reference (docs/design.md §6), to the codes StatusOf answers: every
// code with its status, internal included, and no other.
func TestErrorTableMatchesCodes(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]int{}
	for line := range strings.Lines(string(b)) {
		if m := errorRow.FindStringSubmatch(line); m != nil {
			doc[m[1]], _ = strconv.Atoi(m[2])
		}
	}
	want := map[string]int{CodeInternal: http.StatusInternalServerError}
	for _, c := range codes {
		want[c.code] = c.status
	}
	for code, status := range want {
		if got, ok := doc[code]; !ok {
			t.Errorf("docs/api.md: no row for the error code %s (%d)", code, status)
		} else if got != status {
			t.Errorf("docs/api.md: %s is %d there; the API answers it with %d", code, got, status)
		}
	}
	for code := range doc {
		if _, ok := want[code]; !ok {
			t.Errorf("docs/api.md names the error code %s, which the API has not", code)
		}
	}
}
