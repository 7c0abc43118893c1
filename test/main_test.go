// Package test runs gpulet's real binaries end to end through test/e2e.
package test

import (
	"os"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(helperRoleEnv); role != "" {
		os.Exit(runHelperRole(role))
	}
	os.Exit(e2e.Main(m))
}
