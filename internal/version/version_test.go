package version

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"stamped", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261129071307-28d2c9b4dff4"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "28d2c9b4dff439919b7b90757fb0b49ebdc3fff5"}, {Key: "vcs.modified", Value: "false"}}},
			"v0.0.0-20261129071307-28d2c9b4dff4 commit 28d2c9b4dff439919b7b90757fb0b49ebdc3fff5 go1.26.8"},
		{"modified", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3+dirty"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}},
			"v1.2.3+dirty commit abc (modified) go1.26.8"},
		{"no vcs", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"unknown commit unknown go1.26.8"},
		{"empty", debug.BuildInfo{}, "unknown commit unknown unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBuildInfo(&tc.bi).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--version"}, true},
		{[]string{"--mps", "off", "--version"}, true},
		{[]string{"--", "python", "--version"}, false},
		{[]string{"--versions"}, false},
		{nil, false},
	} {
		if got := Requested(tc.args); got != tc.want {
			t.Errorf("Requested(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestPrint(t *testing.T) {
	var b bytes.Buffer
	Print(&b, "gpulet")
	if !strings.HasPrefix(b.String(), "gpulet ") || !strings.Contains(b.String(), " commit ") || !strings.HasSuffix(b.String(), "\n") {
		t.Errorf("Print wrote %q", b.String())
	}
}
