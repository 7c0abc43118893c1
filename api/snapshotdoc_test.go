package api

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docKey is a key as the snapshot's list in docs/api.md writes it.
var docKey = regexp.MustCompile("`([a-z_]+)`")

// TestSnapshotDocMatchesTypes holds the snapshot's key list in docs/api.md,
// the users' reference for the snapshot (docs/design.md §8, a contract), to
// the JSON keys of the types it is made of: a key added, renamed or dropped
// in the code fails here until the page says so.
func TestSnapshotDocMatchesTypes(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## The snapshot\n")
	if !ok {
		t.Fatal("docs/api.md: no section \"## The snapshot\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	lists := map[string][]string{}
	for line := range strings.Lines(section) {
		item, ok := strings.CutPrefix(line, "- ")
		if !ok {
			continue
		}
		label, keys, _ := strings.Cut(item, ": ")
		label, _, _ = strings.Cut(strings.Trim(label, "`"), "`")
		for _, m := range docKey.FindAllStringSubmatch(keys, -1) {
			lists[label] = append(lists[label], m[1])
		}
	}
	for label, v := range map[string]any{
		"snapshot":                     Snapshot{},
		"gpus[]":                       GPU{},
		"gpus[].capability":            Capability{},
		"gpus[].instances[]":           Instance{},
		"gpus[].instances[].servers[]": MPSServer{},
		"gpus[].outside_processes[]":   GPUProcess{},
		"gpus[].claims[]":              Claim{},
		"usage":                        Usage{},
		"view":                         ViewStatus{},
		"upstreams[]":                  UpstreamStatus{},
		"reservations[]":               ReservationStatus{},
		"over_quota[]":                 QuotaOver{},
	} {
		doc, ok := lists[label]
		if !ok {
			t.Errorf("docs/api.md, the snapshot: no list for %s", label)
			continue
		}
		delete(lists, label)
		var keys []string
		tp := reflect.TypeOf(v)
		for f := range tp.Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				keys = append(keys, name)
			}
		}
		for _, k := range keys {
			if !slices.Contains(doc, k) {
				t.Errorf("docs/api.md, the snapshot's %s: no key %s (%s has it)", label, k, tp)
			}
		}
		for _, k := range doc {
			if !slices.Contains(keys, k) {
				t.Errorf("docs/api.md, the snapshot's %s: key %s is not %s's", label, k, tp)
			}
		}
	}
	for label := range lists {
		t.Errorf("docs/api.md, the snapshot: a list for %s, which this test does not know", label)
	}
}
