package testutil

import (
	"net"
	"testing"
)

// HoldAccepted accepts l's connections until it fails, putting each on the
// returned channel, where they stay open until the test ends; then base, the
// listener under l, is closed and so is every connection held.
func HoldAccepted(t testing.TB, l, base net.Listener) chan net.Conn {
	held := make(chan net.Conn, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		base.Close()
		<-done // no send after the close below
		close(held)
		for c := range held {
			c.Close()
		}
	})
	return held
}
