package reserve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Bounds on a request, so that no request can make the daemon keep much.
const (
	MaxNameLen      = 64
	MaxStages       = 256
	MaxJobsPerStage = 256
	MaxMembers      = 64
	MaxWeight       = 1000
	MaxPriority     = 1000
	// maxJobUnits bounds one job's units before the node's own size is
	// known, so that no sum can overflow.
	maxJobUnits = 1 << 20
)

// Decode reads one JSON reservation request from r, strictly (unknown fields
// and trailing data refused), and checks every field that can be checked
// without the node or the system's accounts. Errors wrap errdefs.ErrInvalid
// and name the field.
func Decode(r io.Reader) (Spec, error) {
	var w wireRequest
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Spec{}, decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "request body: trailing data after the JSON object")
	}
	req := api.ReservationRequest{Name: w.Name, Priority: w.Priority, Share: w.Share, Wait: w.Wait}
	if len(w.Stages) > MaxStages {
		return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "stages: %d, more than %d", len(w.Stages), MaxStages)
	}
	for i, raw := range w.Stages {
		var st api.Stage
		if err := st.UnmarshalJSON(raw); err != nil {
			return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d]: %v", i, err)
		}
		req.Stages = append(req.Stages, st)
	}
	return Check(req)
}

// wireRequest is api.ReservationRequest with its stages left raw, so that a
// malformed stage is named by its place (a test keeps the two in step).
type wireRequest struct {
	Name     string            `json:"name"`
	Stages   []json.RawMessage `json:"stages"`
	Priority int               `json:"priority,omitempty"`
	Share    []api.ShareMember `json:"share,omitempty"`
	Wait     bool              `json:"wait,omitempty"`
}

// Check checks a request and sums its stages.
func Check(req api.ReservationRequest) (Spec, error) {
	if err := CheckName(req.Name); err != nil {
		return Spec{}, err
	}
	s := Spec{Name: req.Name, Priority: req.Priority, Wait: req.Wait}
	switch {
	case len(req.Stages) == 0:
		return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "stages: empty; give each stage's units in order, such as [2,6,6,8]")
	case len(req.Stages) > MaxStages:
		return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "stages: %d, more than %d", len(req.Stages), MaxStages)
	}
	for i, st := range req.Stages {
		need, err := stageNeed(i, st)
		if err != nil {
			return Spec{}, err
		}
		s.Needs = append(s.Needs, need)
	}
	if req.Priority < -MaxPriority || req.Priority > MaxPriority {
		return Spec{}, errdefs.Errorf(errdefs.ErrInvalid, "priority: %d is outside -%d to %d", req.Priority, MaxPriority, MaxPriority)
	}
	share, err := checkShare(req.Share)
	if err != nil {
		return Spec{}, err
	}
	s.Share = share
	return s, nil
}

func stageNeed(i int, st api.Stage) (int, error) {
	if st.Jobs == nil {
		if st.Units < 1 || st.Units > maxJobUnits {
			return 0, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d]: %d units; a stage needs at least 1", i, st.Units)
		}
		return st.Units, nil
	}
	switch {
	case len(st.Jobs) == 0:
		return 0, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d]: no jobs; a stage needs at least one job of at least 1 unit", i)
	case len(st.Jobs) > MaxJobsPerStage:
		return 0, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d]: %d jobs, more than %d", i, len(st.Jobs), MaxJobsPerStage)
	}
	sum := 0
	for j, u := range st.Jobs {
		if u < 1 || u > maxJobUnits {
			return 0, errdefs.Errorf(errdefs.ErrInvalid, "stages[%d][%d]: %d units; a job needs at least 1", i, j, u)
		}
		sum += u
	}
	return sum, nil
}

// CheckName accepts names that are safe in a URL path, a file name, a
// metric label and a log line: a letter or digit, then letters, digits,
// '.', '_' and '-', at most MaxNameLen bytes.
func CheckName(name string) error {
	if name == "" {
		return errdefs.Errorf(errdefs.ErrInvalid, "name: empty; give the reservation a name such as wf1")
	}
	if len(name) > MaxNameLen {
		return errdefs.Errorf(errdefs.ErrInvalid, "name: longer than %d bytes", MaxNameLen)
	}
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || r != '.' && r != '_' && r != '-') {
			return errdefs.Errorf(errdefs.ErrInvalid, "name: %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
		}
	}
	return nil
}

// checkShare checks the share group's shape; names are resolved later.
func checkShare(in []api.ShareMember) ([]Member, error) {
	if len(in) > MaxMembers {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "share: %d members, more than %d", len(in), MaxMembers)
	}
	var out []Member
	seen := map[string]bool{}
	weighted := len(in) > 0 && in[0].Weight != 0
	for i, m := range in {
		who, err := identity.Parse(m.User)
		if err == nil && who.Kind == identity.Everyone {
			err = fmt.Errorf(`"*" is not a member: list users and group:NAME`)
		}
		switch {
		case err != nil:
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "share[%d].user: %v", i, err)
		case seen[who.String()]:
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "share[%d].user: %q is listed twice", i, m.User)
		case m.Weight < 0 || m.Weight > MaxWeight:
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "share[%d].weight: %d is outside 1 to %d", i, m.Weight, MaxWeight)
		case weighted != (m.Weight != 0):
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "share[%d].weight: give every member a weight, or none (then they are served in the order listed)", i)
		}
		seen[who.String()] = true
		out = append(out, Member{Name: who.String(), Group: who.Kind == identity.Group, ID: who.ID, Weight: m.Weight})
	}
	return out, nil
}

// Resolve finds the id of every share member in acc (identity.SystemDirectory
// in gpuletd); an unknown name is a bad request naming the member.
func (s *Spec) Resolve(acc identity.Directory) error {
	for i := range s.Share {
		m := &s.Share[i]
		who, err := m.Principal().Resolve(acc)
		if err != nil {
			return errdefs.Errorf(errdefs.ErrInvalid, "share[%d].user: no %s %q on this node", i, who.Kind, who.Name)
		}
		m.ID = who.ID
	}
	return nil
}

// decodeError turns a decoder error into a bad request naming the field or
// place.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return errdefs.Errorf(errdefs.ErrInvalid, `request body: empty, want a JSON object such as {"name":"wf1","stages":[2,6,6,8]}`)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.Errorf(errdefs.ErrInvalid, "request body: malformed JSON: it ends too early")
	case errors.As(err, &typeErr):
		return errdefs.Errorf(errdefs.ErrInvalid, "%s: must be %s, got a JSON %s", typeErr.Field, kindOf(typeErr.Field), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return errdefs.Errorf(errdefs.ErrInvalid, "request body: malformed JSON at byte %d: %v", syntaxErr.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errdefs.Errorf(errdefs.ErrInvalid, "request body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return errdefs.Errorf(errdefs.ErrInvalid, "request body: %v", err)
}

// kindOf says what a field of the request holds, for a message.
func kindOf(field string) string {
	switch {
	case field == "name" || strings.HasSuffix(field, ".user"):
		return "a string"
	case field == "wait":
		return "true or false"
	case field == "stages" || field == "share":
		return "a list"
	}
	return "a whole number"
}
