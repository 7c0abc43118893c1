package gpurun

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(Options) bool
		wantErr string
	}{
		{"defaults", []string{"--", "python", "train.py"}, func(o Options) bool {
			return o.Units == 1 && slices.Equal(o.Command, []string{"python", "train.py"})
		}, ""},
		{"flags", []string{"--units", "2", "--gpu", "1", "--type", "a100", "--memory", "8G", "--wait", "10s", "--task", "t", "--", "x"}, func(o Options) bool {
			return o.Units == 2 && o.GPU == "1" && o.Type == "a100" && o.MemoryMiB == 8192 && o.Wait == 10*time.Second && o.Task == "t"
		}, ""},
		{"command flags are the command's", []string{"python", "--units", "9"}, func(o Options) bool {
			return o.Units == 1 && slices.Equal(o.Command, []string{"python", "--units", "9"})
		}, ""},
		{"no command", []string{"--units", "2"}, nil, "no command given"},
		{"zero units", []string{"--units", "0", "--", "x"}, nil, "--units must be at least 1"},
		{"bad memory", []string{"--memory", "lots", "--", "x"}, nil, `--memory "lots"`},
		{"bad wait", []string{"--wait", "soon", "--", "x"}, nil, `--wait "soon"`},
		{"offline with wait", []string{"--offline", "--wait", "1s", "--", "x"}, nil, "--offline"},
		{"unknown flag", []string{"--gpus", "2", "--", "x"}, nil, "unknown flag"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(o) {
				t.Fatalf("%+v %v", o, err)
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]uint64{"8G": 8192, "8g": 8192, "8GiB": 8192, "8GB": 8192, "512M": 512, "512MiB": 512, "8000": 8000, "1T": 1 << 20} {
		if got, err := ParseMemory(in); err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1G", "1.5G", "G", "8X", "99999999999G"} {
		if _, err := ParseMemory(bad); err == nil {
			t.Errorf("ParseMemory(%q) accepted", bad)
		}
	}
}

func FuzzParseMemory(f *testing.F) {
	for _, s := range []string{"8G", "512M", "8000", "1T", "0", "x", "8GiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseMemory(s)
		if err == nil && n == 0 {
			t.Fatalf("%q parsed as 0 MiB", s)
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"-- true", "--units 2 -- x", "--memory 8G --gpu 0 -- a b", "--offline -- x", "--units", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		o, err := Parse(strings.Fields(line), io.Discard)
		if err != nil {
			return
		}
		if o.Units < 1 || len(o.Command) == 0 {
			t.Fatalf("accepted %+v", o)
		}
	})
}

func TestMergeEnvReplacesGpuletVariables(t *testing.T) {
	got := mergeEnv([]string{"PATH=/bin", "CUDA_VISIBLE_DEVICES=old", "HOME=/root"}, map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1", LeaseIDEnv: "l-1"})
	want := []string{"PATH=/bin", "HOME=/root", "CUDA_VISIBLE_DEVICES=GPU-1", "GPULET_LEASE_ID=l-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
