package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

// An error of a kind reads as its message alone and matches its kind, also
// wrapped further, and no other kind.
func TestErrorfKeepsKindAndMessage(t *testing.T) {
	err := Errorf(ErrNoCapacity, "GPU %d has %d unit(s) free", 0, 2)
	if err.Error() != "GPU 0 has 2 unit(s) free" {
		t.Fatalf("message %q", err.Error())
	}
	wrapped := fmt.Errorf("after waiting 1s: %w", err)
	if !errors.Is(wrapped, ErrNoCapacity) || errors.Is(wrapped, ErrInvalid) {
		t.Fatalf("kind lost or confused: %v", wrapped)
	}
}
