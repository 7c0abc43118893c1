package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct{ typed, stderr string }{
		{"stauts", `gpulet: unknown command "stauts": did you mean status?` + "\n"},
		{"lease", `gpulet: unknown command "lease": did you mean leases?` + "\n"},
		{"reservation", `gpulet: unknown command "reservation": did you mean reservations?` + "\n"},
		{"compl", `gpulet: unknown command "compl": did you mean completion?` + "\n"},
		{"frobnicate", `gpulet: unknown command "frobnicate"` + "\n"},
	} {
		t.Run(tc.typed, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), []string{tc.typed}, &out, &errb)
			want := tc.stderr + "Run 'gpulet help' for usage.\n"
			if code != ExitUsage || errb.String() != want {
				t.Errorf("gpulet %s: exit %d, stderr %q; want %d, %q", tc.typed, code, errb.String(), ExitUsage, want)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"--version"}, &out, &errb); code != ExitOK || !strings.HasPrefix(out.String(), "gpulet ") || !strings.Contains(out.String(), " commit ") {
		t.Errorf("gpulet --version: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func completion(t *testing.T, shell string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"completion", shell}, &out, &errb); code != ExitOK {
		t.Fatalf("gpulet completion %s: exit %d: %s", shell, code, errb.String())
	}
	return out.String()
}

// TestBashCompletion sources the bash script in a real bash and asks it to
// complete what a user types.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on PATH")
	}
	script := t.TempDir() + "/gpulet.bash"
	if err := os.WriteFile(script, []byte(completion(t, "bash")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line string // the words typed, the last one being completed
		want string
	}{
		{"gpulet sta", "status"},
		{"gpulet re", "release reservations reserve"},
		{"gpulet --socket /s lea", "leases"},
		{"gpulet leases --", "--all --json --socket"},
		{"gpulet config ch", "check"},
		{"gpulet slurm ", "task-prolog epilog gres --batch --dev-prefix --node --socket"},
		{"gpulet completion f", "fish"},
		{"gpulet help adv", "advance"},
		{"gpulet --v", "--version"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			words := strings.Fields(tc.line)
			if strings.HasSuffix(tc.line, " ") {
				words = append(words, "")
			}
			cmd := exec.Command(bash, "--norc", "-c", `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _gpulet; echo "${COMPREPLY[*]}"`, "bash", script)
			cmd.Args = append(cmd.Args, words...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Errorf("%q completes to %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

func TestZshAndFishCompletion(t *testing.T) {
	if z := completion(t, "zsh"); !strings.Contains(z, "bashcompinit") || !strings.Contains(z, "complete -o default -F _gpulet gpulet") {
		t.Errorf("zsh completion:\n%s", z)
	}
	fish := completion(t, "fish")
	for _, want := range []string{
		"complete -c gpulet -n __fish_use_subcommand -a status -d 'Show one row per GPU: state, eligibility, a bar of its units (# leased, o offline,'\n",
		"complete -c gpulet -n '__fish_seen_subcommand_from leases' -l all\n",
		"complete -c gpulet -n '__fish_seen_subcommand_from config' -a 'check'\n",
		"complete -c gpulet -n __fish_use_subcommand -l version",
	} {
		if !strings.Contains(fish, want) {
			t.Errorf("fish completion lacks %q:\n%s", want, fish)
		}
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"completion", "tcsh"}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), `no completion for shell "tcsh": want bash, zsh or fish`) {
		t.Errorf("gpulet completion tcsh: exit %d, %q", code, errb.String())
	}
}
