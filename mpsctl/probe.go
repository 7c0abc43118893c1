package mpsctl

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gpulet/gpulet/internal/procfs"
)

// Server is one live MPS server of an instance.
type Server struct {
	PID int
	// UID is the server's real uid, the user whose clients it serves; nil
	// when it could not be read (the server ended meanwhile).
	UID *uint32
	// Clients are the pids of its clients, as the control daemon lists them.
	Clients []int
}

// probeResult is what one successful probe learned.
type probeResult struct {
	pid       int
	serverUID *uint32
	clients   int
	servers   []Server
}

// ServerSource is what the control daemon would answer about an instance's
// MPS servers: get_server_list, get_client_list, and each server's uid.
type ServerSource interface {
	ServerList(gpuUUID string, k int) []int
	// ClientList is false for a server that is gone.
	ClientList(server int) ([]int, bool)
	ServerUID(server int) (uint32, bool)
}

// probe asks the instance's daemon the harmless question and the server list, and
// each server for its clients.
func (d *Daemons) probe(ctx context.Context, in *instance) (probeResult, error) {
	var r probeResult
	out, err := d.run.run(ctx, in.env, probeCommands)
	if err != nil {
		return r, err
	}
	servers, err := parseProbe(out)
	if err != nil {
		return r, fmt.Errorf("mpsctl: %s: %w", in, err)
	}
	if src := d.cfg.Servers; src != nil {
		servers = src.ServerList(in.gpu, in.k)
	}
	// Only for status: the daemon answered, so it runs even if its pid is unknown.
	r.pid, _ = lockHolder(in.pipeDir)
	for _, s := range servers {
		clients, uid, err := d.serverClients(ctx, in, s)
		if err != nil {
			return r, err
		}
		srv := Server{PID: s, Clients: clients, UID: uid}
		r.servers = append(r.servers, srv)
		r.clients += len(clients)
		// One server serves at a time (a client of another user waits until
		// it has drained); an idle one serves nobody and binds the instance
		// to no user, or one user's finished job would keep every other user
		// off the instance for good.
		if len(clients) > 0 && srv.UID != nil && r.serverUID == nil {
			r.serverUID = srv.UID
		}
	}
	return r, nil
}

// serverClients asks for the clients and the uid of one server of the
// instance.
func (d *Daemons) serverClients(ctx context.Context, in *instance, server int) ([]int, *uint32, error) {
	if src := d.cfg.Servers; src != nil {
		clients, _ := src.ClientList(server)
		uid, ok := src.ServerUID(server)
		if !ok {
			return clients, nil, nil
		}
		return clients, &uid, nil
	}
	out, err := d.run.run(ctx, in.env, "get_client_list "+strconv.Itoa(server)+"\n")
	if err != nil {
		return nil, nil, err
	}
	clients, err := parseClients(out, server)
	if err != nil {
		return nil, nil, fmt.Errorf("mpsctl: %s: %w", in, err)
	}
	uid, err := procfs.RealUID(server)
	if err != nil {
		return clients, nil, nil
	}
	return clients, &uid, nil
}
