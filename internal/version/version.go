// Package version says which gpulet a binary is: its module version and the
// commit it was built from, as the Go toolchain records them in the binary
// (runtime/debug build info), so that no build step has to stamp them.
package version

import (
	"fmt"
	"io"
	"runtime/debug"
	"slices"
)

// Unknown stands for a figure the build info does not hold: a binary built
// outside a git checkout has no commit, and a test binary no version.
const Unknown = "unknown"

// Info is what a binary says about its build.
type Info struct {
	// Version is the main module's version: a tag, or the pseudo-version Go
	// makes from the commit ("v0.0.0-20261129071307-28d2c9b4dff4+dirty").
	Version string
	// Commit is the full commit id; Modified says the work tree had changes
	// not committed.
	Commit   string
	Modified bool
	// Go is the toolchain that built the binary.
	Go string
}

// Get reads the running binary's build info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: Unknown, Commit: Unknown, Go: Unknown}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo reads bi as Get does.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, Commit: Unknown, Go: bi.GoVersion}
	// "(devel)" is what go build writes without VCS information; a test
	// binary has no version at all.
	if in.Version == "" || in.Version == "(devel)" {
		in.Version = Unknown
	}
	if in.Go == "" {
		in.Go = Unknown
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the one line --version prints after the binary's name:
// "v0.0.0-2026…-28d2c9b4dff4 commit 28d2c9b4dff4… (modified) go1.26.8".
func (in Info) String() string {
	s := fmt.Sprintf("%s commit %s", in.Version, in.Commit)
	if in.Modified {
		s += " (modified)"
	}
	return s + " " + in.Go
}

// Requested says whether args ask for --version: its own flag before any
// "--" (what follows "--" is a command's own, as gpurun's are).
func Requested(args []string) bool {
	end := slices.Index(args, "--")
	if end < 0 {
		end = len(args)
	}
	return slices.Contains(args[:end], "--version")
}

// Print writes "NAME VERSION commit COMMIT GO" and a newline.
func Print(w io.Writer, name string) {
	fmt.Fprintf(w, "%s %s\n", name, Get())
}
