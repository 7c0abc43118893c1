package server

import (
	"net/http"
	"strconv"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// releaseSlurmJob ends what a Slurm job still holds: the epilog's safety net
// behind the cgroup watch.
func (s *Server) releaseSlurmJob(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	job, err := strconv.ParseUint(r.PathValue("job"), 10, 64)
	if err != nil || job == 0 {
		return api.Errorf(api.ErrBadRequest, "slurm job: %q is not a job id (a whole number from 1)", r.PathValue("job"))
	}
	ids, err := s.slurm.ReleaseJob(peer, job)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.SlurmRelease{JobID: job, Released: ids})
}
