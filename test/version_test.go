package test

import (
	"debug/buildinfo"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/gpulet/gpulet/internal/version"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestVersion: every binary answers --version with its name, the module
// version and the commit it was built from, as its build info records them;
// gpuletd's snapshot and gpulet_node_info say the same.
func TestVersion(t *testing.T) {
	info, err := buildinfo.ReadFile(e2e.Bin("gpuletd"))
	if err != nil {
		t.Fatal(err)
	}
	want := version.FromBuildInfo(info)
	// Go stamps the commit in a clone, whose .git is a folder; a git
	// worktree's .git is a file, which Go does not read, and every binary
	// then says "unknown" alike.
	if fi, err := os.Stat("../.git"); err == nil && fi.IsDir() {
		if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(want.Commit) || want.Version == version.Unknown {
			t.Fatalf("gpuletd's build info holds version %q, commit %q: want a module version and a commit", want.Version, want.Commit)
		}
	} else {
		t.Logf("../.git is not a folder: Go records no commit, and the binaries say version %q commit %q", want.Version, want.Commit)
	}
	for _, name := range []string{"gpuletd", "gpurun", "gpulet", "gpulet-collector", "gpulet-replay"} {
		out, code := e2e.Output(t, exec.Command(e2e.Bin(name), "--version"))
		if line := name + " " + want.String() + "\n"; code != 0 || out != line {
			t.Errorf("%s --version: exit %d, %q; want 0, %q", name, code, out, line)
		}
	}
	d := e2e.Start(t)
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != want.Version || s.Commit != want.Commit {
		t.Errorf("snapshot says version %q commit %q, the binary %q %q", s.Version, s.Commit, want.Version, want.Commit)
	}
	m, err := d.Client.Metrics(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	label := regexp.MustCompile(`gpulet_node_info\{[^}]*commit="` + want.Commit + `"[^}]*version="` + regexp.QuoteMeta(want.Version) + `"`)
	if !label.Match(m) {
		t.Errorf("gpulet_node_info does not carry commit %s and version %s:\n%s", want.Commit, want.Version, m)
	}
}
