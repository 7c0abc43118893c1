package identity

import "testing"

func TestUserName(t *testing.T) {
	// Root is in every user database; 4294967294 in none that tests run on.
	if got := UserName(0); got != "root (uid 0)" {
		t.Errorf("UserName(0) = %q", got)
	}
	if got := UserName(4294967294); got != "uid 4294967294" {
		t.Errorf("UserName(4294967294) = %q", got)
	}
}
