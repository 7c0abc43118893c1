package procfs

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	tail := " 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 100 10 18446744073709551615"
	for _, tc := range []struct {
		name  string
		in    string
		want  Stat
		valid bool
	}{
		{"plain", "42 (sleep) S" + tail, Stat{'S', 123456}, true},
		{"name with spaces and parens", "42 (a) b) (c) Z" + tail, Stat{'Z', 123456}, true},
		{"no name", "42 sleep S" + tail, Stat{}, false},
		{"short", "42 (sleep) S 1 2", Stat{}, false},
		{"bad start time", "42 (x) S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 abc", Stat{}, false},
		{"empty", "", Stat{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tc.in))
			if (err == nil) != tc.valid || got != tc.want {
				t.Fatalf("ParseStat = %+v, %v; want %+v (valid %v)", got, err, tc.want, tc.valid)
			}
		})
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("42 (sleep) S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 100"))
	f.Add([]byte("1 ()) R"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStat(b)
		if err == nil && s.State == 0 {
			t.Fatalf("parsed %q without a state", b)
		}
	})
}

func TestParseRealUID(t *testing.T) {
	uid, err := ParseRealUID(strings.NewReader("Name:\tx\nUid:\t1000\t1001\t1000\t1000\nGid:\t5\n"))
	if err != nil || uid != 1000 {
		t.Fatalf("uid %d, %v", uid, err)
	}
	for _, bad := range []string{"", "Uid:\n", "Uid:\tx\n"} {
		if _, err := ParseRealUID(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseRealUID(f *testing.F) {
	f.Add("Uid:\t0\t0\t0\t0\n")
	f.Fuzz(func(t *testing.T, s string) { ParseRealUID(strings.NewReader(s)) })
}

func TestLiveProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil || st.StartTime == 0 || st.Exited() {
		t.Fatalf("stat %+v, %v", st, err)
	}
	uid, err := RealUID(cmd.Process.Pid)
	if err != nil || uid != uint32(os.Getuid()) {
		t.Fatalf("uid %d, %v", uid, err)
	}
	sleep, _ := exec.LookPath("sleep")
	if !SameExecutable(cmd.Process.Pid, sleep) || SameExecutable(cmd.Process.Pid, "/bin/sh") && sleep != "/bin/sh" {
		t.Fatal("SameExecutable is wrong")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := ReadStat(cmd.Process.Pid); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("stat of a reaped process: %v", err)
	}
	if _, err := ReadStat(-1); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("stat of pid -1: %v", err)
	}
}
