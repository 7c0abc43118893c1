package api

import (
	"strings"
	"testing"
)

func TestParseComputeCapability(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    ComputeCapability
		wantErr string
	}{
		{in: "8.0", want: ComputeCapability{8, 0}},
		{in: "7.5", want: ComputeCapability{7, 5}},
		{in: "12.1", want: ComputeCapability{12, 1}},
		{in: "08.9", want: ComputeCapability{8, 9}},
		{in: "8", wantErr: "MAJOR.MINOR"},
		{in: "", wantErr: "MAJOR.MINOR"},
		{in: "8.", wantErr: "MAJOR.MINOR"},
		{in: ".5", wantErr: "MAJOR.MINOR"},
		{in: "8.0.1", wantErr: "MAJOR.MINOR"},
		{in: "8.10", wantErr: "MAJOR.MINOR"},
		{in: "100.0", wantErr: "MAJOR.MINOR"},
		{in: " 8.0", wantErr: "MAJOR.MINOR"},
		{in: "+8.0", wantErr: "MAJOR.MINOR"},
		{in: "-8.0", wantErr: "MAJOR.MINOR"},
		{in: "8,0", wantErr: "MAJOR.MINOR"},
		{in: "sm_80", wantErr: "MAJOR.MINOR"},
		{in: "0.5", wantErr: "start at 1.0"},
	} {
		got, err := ParseComputeCapability(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseComputeCapability(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseComputeCapability(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestComputeCapabilityOrder(t *testing.T) {
	order := []ComputeCapability{{}, {7, 0}, {7, 5}, {8, 0}, {8, 6}, {8, 9}, {9, 0}, {12, 0}}
	for i, a := range order {
		for j, b := range order {
			if got := a.Less(b); got != (i < j) {
				t.Errorf("%v.Less(%v) = %v", a, b, got)
			}
		}
	}
	if !(ComputeCapability{}).IsZero() || (ComputeCapability{8, 0}).IsZero() {
		t.Error("IsZero is wrong")
	}
}

// FuzzParseComputeCapability: whatever is accepted writes back as itself
// (leading zeros aside) and is at least 1.0.
func FuzzParseComputeCapability(f *testing.F) {
	for _, s := range []string{"8.0", "7.5", "12.1", "8", "8.", ".0", "8.0.1", "0.0", "99.9", "1e1.0", "٨.٠", "8.0\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseComputeCapability(s)
		if err != nil {
			if !c.IsZero() {
				t.Fatalf("%q: %v returned with an error", s, c)
			}
			if !strings.Contains(err.Error(), "compute capability") {
				t.Fatalf("%q: error %q does not say what was wanted", s, err)
			}
			return
		}
		if c.Major < 1 || c.Major > 99 || c.Minor < 0 || c.Minor > 9 {
			t.Fatalf("%q: accepted out of range as %v", s, c)
		}
		if again, err := ParseComputeCapability(c.String()); err != nil || again != c {
			t.Fatalf("%q: %v does not read back: %v %v", s, c, again, err)
		}
		if strings.TrimLeft(s, "0") != c.String() && s != c.String() {
			t.Fatalf("%q read as %v", s, c)
		}
	})
}
