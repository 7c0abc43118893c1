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
		{"plain", "42 (sleep) S" + tail, Stat{State: 'S', PPID: 1, StartTime: 123456}, true},
		{"name with spaces and parens", "42 (a) b) (c) Z" + tail, Stat{State: 'Z', PPID: 1, StartTime: 123456}, true},
		{"no name", "42 sleep S" + tail, Stat{}, false},
		{"short", "42 (sleep) S 1 2", Stat{}, false},
		{"bad start time", "42 (x) S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 abc", Stat{}, false},
		{"empty", "", Stat{}, false},
		{"state not a letter", "42 (x) \x00 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456", Stat{}, false},
		{"state of two letters", "42 (x) SS 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456", Stat{}, false},
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
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"Name:\tsleep\nUid:\t1000\t0\t0\t0\nGid:\t1\t1\t1\t1\n", 1000, true},
		{"Uid:\t4294967295\t0\t0\t0\n", 4294967295, true},
		{"Uid:\t4294967296\t0\t0\t0\n", 0, false},
		{"Uid:\n", 0, false},
		{"Uid:\tx\n", 0, false},
		{"Gid:\t5\n", 0, false},
		{"Uid:\t-1\t0\n", 0, false},
		{"", 0, false},
	} {
		got, err := ParseRealUID(strings.NewReader(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseRealUID(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseRealUID(f *testing.F) {
	for _, s := range []string{"Uid:\t0\t0\t0\t0\n", "Name:\tx\nUid:\t1000\t1000\t1000\t1000\n", "Uid:", "Uid:\tx", "\n\nUid:\t99999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		uid, err := ParseRealUID(strings.NewReader(s))
		if err == nil && !strings.Contains(s, "Uid:") {
			t.Fatalf("uid %d from input without a Uid line", uid)
		}
	})
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
