package server

import (
	"net/http"

	"github.com/gpulet/gpulet/identity"
)

// placements is the dry run: where a lease of the body would go now.
func (s *Server) placements(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	req, err := DecodeRequestBytes(bodyBytes(r))
	if err != nil {
		return err
	}
	p, err := s.core.Explain(peer, req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *Server) profiles(w http.ResponseWriter, _ *http.Request, peer identity.Peer) error {
	return writeJSON(w, http.StatusOK, s.core.Profiles(peer))
}

func (s *Server) pools(w http.ResponseWriter, _ *http.Request, peer identity.Peer) error {
	return writeJSON(w, http.StatusOK, s.core.Pools(peer))
}

func (s *Server) quotas(w http.ResponseWriter, _ *http.Request, peer identity.Peer) error {
	return writeJSON(w, http.StatusOK, s.core.Quotas(peer))
}
