package test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// TestOneProcessHoldsAtMostMUnits: with --units-per-client 1, a plain user's
// process gets one unit bound to it, not one per request (it got four); a
// lease bound to time is bound to no process and is not counted.
func TestOneProcessHoldsAtMostMUnits(t *testing.T) {
	group := e2e.NewGroup(t)
	u := e2e.NewUser(t, group)
	d := e2e.Start(t, "--socket-group", group.Name, "--units-per-client", "1")
	openToOthers(t, d)
	cmd := u.Command(exec.Command(copyForOthers(t, os.Args[0])))
	cmd.Env = append(os.Environ(), helperRoleEnv+"=bound", "GPULET_SOCKET="+d.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bound role: %v\n%s", err, out)
	}
	want := "bound0=ok|bound1=bad_request|bound2=bad_request|ttl=ok"
	if got := strings.Join(strings.Fields(string(out)), "|"); got != want {
		t.Fatalf("one process asking for units:\n%s\nwant %s", out, want)
	}
}
