package testutil

import "testing"

func blockOn(ch chan struct{}) { <-ch }

// Parked finds a goroutine blocked in a function, and not one that runs it.
func TestParked(t *testing.T) {
	if Parked("testutil.blockOn") {
		t.Fatal("Parked before any goroutine blocked")
	}
	ch := make(chan struct{})
	done := make(chan struct{})
	go func() { blockOn(ch); close(done) }()
	Eventually(t, "the goroutine to block", func() bool { return Parked("testutil.blockOn") })
	if Parked("testutil.TestParked(") {
		t.Fatal("the running test goroutine counted as parked")
	}
	close(ch)
	<-done
	if Parked("testutil.blockOn") {
		t.Fatal("Parked after the goroutine returned")
	}
}
