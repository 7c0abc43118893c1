package server

import (
	"net/http"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// Who uses what, for every user of the socket, as squeue shows every job:
// GET /v1/leases?all=true lists the node's leases, the caller's in full and
// the others' with who holds them and where, but none of what would let the
// caller act on them or reach their processes' MPS pipes (id, env, labels).
// An admin keeps them private with --private-leases.

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	all := false
	switch v := r.URL.Query().Get("all"); v {
	case "", "false":
	case "true":
		all = true
	default:
		return api.Errorf(api.ErrBadRequest, "all: %q is not true or false", v)
	}
	if !all || peer.Admin || s.PrivateLeases {
		return writeJSON(w, http.StatusOK, api.LeaseList{Leases: s.core.List(peer)})
	}
	every := s.core.List(identity.Peer{UID: peer.UID, GID: peer.GID, Admin: true})
	for i := range every {
		if every[i].Owner.UID != peer.UID {
			every[i] = othersLease(every[i])
		}
	}
	return writeJSON(w, http.StatusOK, api.LeaseList{Leases: every})
}

// othersLease is l as a user other than its owner sees it.
func othersLease(l api.Lease) api.Lease {
	l.ID, l.Env, l.Labels = "", nil, nil
	return l
}
