package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// The handlers of workflow reservations, of the node (drain, undrain) and of
// the simulated GPUs.

func (s *Server) listReservations(w http.ResponseWriter, _ *http.Request, _ identity.Peer) error {
	rs := s.res.List()
	if rs == nil {
		rs = []api.Reservation{}
	}
	return writeJSON(w, http.StatusOK, api.ReservationList{Reservations: rs})
}

func (s *Server) createReservation(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	spec, err := reserve.Decode(r.Body)
	if err != nil {
		return err
	}
	res, err := s.res.Reserve(peer, spec)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/reservations/"+res.Name)
	return writeJSON(w, http.StatusCreated, res)
}

func (s *Server) getReservation(w http.ResponseWriter, r *http.Request, _ identity.Peer) error {
	res, err := s.res.Get(r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) advanceReservation(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	res, err := s.res.Advance(peer, r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) deleteReservation(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	if err := s.res.Unreserve(peer, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) drain(w http.ResponseWriter, _ *http.Request, peer identity.Peer) error {
	if !peer.Admin {
		return api.Errorf(api.ErrForbidden, "draining the node is for root and the admin group")
	}
	s.core.SetDraining(true)
	return s.writeSnapshot(w)
}

// undrain resumes new leases on the node, or, with {"gpu":...}, clears that
// GPU's Xid fault and leaves the node's draining as it is.
func (s *Server) undrain(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	if !peer.Admin {
		return api.Errorf(api.ErrForbidden, "undraining the node and clearing GPU faults are for root and the admin group")
	}
	req, err := DecodeUndrain(r.Body)
	if err != nil {
		return err
	}
	if req.GPU == "" {
		s.core.SetDraining(false)
		return s.writeSnapshot(w)
	}
	idx, xid, err := s.core.ClearXid(req.GPU)
	if err != nil {
		return err
	}
	if xid != 0 {
		s.log.Info("Xid fault cleared by an admin", "gpu", idx, "xid", xid, "uid", peer.UID, "pid", peer.PID)
	}
	return s.writeSnapshot(w)
}

// DecodeUndrain reads the optional body of POST /v1/node/undrain: empty (or
// only white space) for the whole node, else exactly {"gpu":"N or UUID"}.
func DecodeUndrain(r io.Reader) (api.UndrainRequest, error) {
	var req api.UndrainRequest
	b, err := io.ReadAll(r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, api.Errorf(api.ErrRequestTooLarge, "request body: larger than %d bytes", tooBig.Limit)
		}
		return req, api.Errorf(api.ErrBadRequest, "request body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return req, nil
	}
	if err := DecodeJSON(bytes.NewReader(b), &req); err != nil {
		return req, err
	}
	if strings.TrimSpace(req.GPU) == "" {
		return req, api.Errorf(api.ErrBadRequest, `gpu: give a GPU index or UUID, as {"gpu":"0"}; an empty body resumes the node`)
	}
	return req, nil
}

func (s *Server) writeSnapshot(w http.ResponseWriter) error {
	p, err := s.published()
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(p.JSON())
	return nil
}

func (s *Server) simGPU(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	if peer.UID != 0 {
		return api.Errorf(api.ErrForbidden, "the simulated GPU controls are for root only")
	}
	idx, err := strconv.Atoi(r.PathValue("index"))
	if err != nil {
		return api.Errorf(api.ErrBadRequest, "GPU index %q is not a number", r.PathValue("index"))
	}
	var u api.SimGPUUpdate
	if err := DecodeJSON(r.Body, &u); err != nil {
		return err
	}
	if err := s.sim(idx, u); err != nil {
		return err
	}
	if u.Xid != nil {
		// The simulated counterpart of the NVML watcher's line: one per event.
		x := *u.Xid
		if inventory.XidCritical(x) {
			s.log.Error("critical Xid event (simulated): the GPU is failed and takes no new leases until an admin clears it (gpulet undrain --gpu N) or gpuletd restarts",
				"gpu", idx, "xid", x, "meaning", inventory.XidMeaning(x), "uid", peer.UID)
		} else {
			s.log.Warn("Xid event of an application error (simulated); the GPU stays in service", "gpu", idx, "xid", x, "meaning", inventory.XidMeaning(x), "uid", peer.UID)
		}
	}
	pub, err := s.published()
	if err != nil {
		return err
	}
	for _, g := range pub.Snapshot.GPUs {
		if g.Index == idx {
			return writeJSON(w, http.StatusOK, g)
		}
	}
	return fmt.Errorf("GPU %d missing from the snapshot", idx)
}
