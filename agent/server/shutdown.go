package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// unstarted tracks the connections that have not begun a request. At a stop,
// http.Server.Shutdown counts such a connection as busy for five seconds
// after it was accepted, so any local user could hold up gpuletd's stop by
// connecting and sending nothing; Shutdown closes them first.
type unstarted struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track is an http.Server's ConnState.
func (u *unstarted) track(c net.Conn, st http.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st == http.StateNew {
		if u.conns == nil {
			u.conns = map[net.Conn]struct{}{}
		}
		u.conns[c] = struct{}{}
		return
	}
	delete(u.conns, c)
}

func (u *unstarted) closeAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		c.Close()
	}
	clear(u.conns)
}

// Shutdown stops srv, one of s's servers: it closes the connections that
// never began a request, then waits for the requests under way until ctx
// ends (http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context, srv *http.Server) error {
	s.unstarted.closeAll()
	done := make(chan struct{})
	defer close(done)
	// Again while Shutdown waits: one accepted before the listener closed.
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				s.unstarted.closeAll()
			}
		}
	}()
	return srv.Shutdown(ctx)
}
