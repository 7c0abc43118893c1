package placement

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoConfigDependency keeps placement free of the config file's parser:
// the collector and the replay share the engine, and neither reads a config
// file, so neither should carry a YAML library through it. Pools and weights
// are placement's types; config maps the file onto them.
func TestNoConfigDependency(t *testing.T) {
	// go test puts the go command that runs it first on PATH.
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, d := range deps {
		if d == "github.com/gpulet/gpulet/config" || strings.Contains(strings.ToLower(d), "yaml") {
			t.Errorf("placement depends on %s", d)
		}
	}
}
