package test

import (
	"debug/buildinfo"
	"os"
	"regexp"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// TestBuildTagsAreTheMakefiles holds the harness's build tags to the
// Makefile's BUILD_TAGS, and checks that the gpuletd the tests run was built
// with them, so that the tests (and the memory benchmark) run the binary
// `make` builds.
func TestBuildTagsAreTheMakefiles(t *testing.T) {
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUILD_TAGS\s*:=\s*(\S*)\s*$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no BUILD_TAGS")
	}
	if string(m[1]) != e2e.BuildTags {
		t.Fatalf("the Makefile builds with tags %q, the harness with %q", m[1], e2e.BuildTags)
	}
	info, err := buildinfo.ReadFile(e2e.Bin("gpuletd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" {
			if s.Value != e2e.BuildTags {
				t.Fatalf("gpuletd was built with tags %q, want %q", s.Value, e2e.BuildTags)
			}
			return
		}
	}
	t.Fatalf("gpuletd was built without tags, want %q", e2e.BuildTags)
}
