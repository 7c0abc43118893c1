package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"
)

// Reservation states.
const (
	// ReservationPending: queued ("wait": true) until its units can be set
	// aside; the units freed meanwhile are held for the first in line.
	ReservationPending = "pending"
	// ReservationActive: its units are set aside; its stages run.
	ReservationActive = "active"
	// ReservationEnded: advanced past its last stage; its units went back to
	// the node. Only the answer to that advance shows it.
	ReservationEnded = "ended"
)

// ReservationRequest is the body of POST /v1/reservations (docs/design.md §12).
type ReservationRequest struct {
	Name string `json:"name"`
	// Stages are the workflow's stages in order, each a number of units or
	// its jobs' units ([2,3,1] is a stage of 6).
	Stages   []Stage `json:"stages"`
	Priority int     `json:"priority,omitempty"`
	// Share lists who may borrow the units a stage does not need.
	Share []ShareMember `json:"share,omitempty"`
	// Wait queues the reservation (state "pending") when its units cannot
	// be set aside now, instead of failing with insufficient_units.
	Wait bool `json:"wait,omitempty"`
}

// Stage is one stage of a workflow: Units, or, when Jobs is not nil, the
// jobs' units, which run in parallel (the stage needs their sum). In JSON it
// is a number or a list of numbers.
type Stage struct {
	Units int
	Jobs  []int
}

// MarshalJSON writes the stage as a number, or as its jobs' list.
func (s Stage) MarshalJSON() ([]byte, error) {
	if s.Jobs != nil {
		return json.Marshal(s.Jobs)
	}
	return json.Marshal(s.Units)
}

// ErrStageShape says that a stage is neither a number nor a list of
// numbers; the daemon's decoder names the stage.
var ErrStageShape = errors.New("must be a whole number of units, or a list of its jobs' units such as [2,3,1]")

// UnmarshalJSON reads a number or a list of numbers. A list is kept as Jobs
// and Units stays 0: the daemon sums it once every job is checked.
func (s *Stage) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*s = Stage{}
	if len(b) > 0 && b[0] == '[' {
		var jobs []int
		if err := json.Unmarshal(b, &jobs); err != nil {
			return ErrStageShape
		}
		if jobs == nil {
			jobs = []int{}
		}
		s.Jobs = jobs
		return nil
	}
	if err := json.Unmarshal(b, &s.Units); err != nil {
		return ErrStageShape
	}
	return nil
}

// ShareMember is one member of a reservation's share group: User is a user
// name or "group:NAME"; Weight is its share (all members have one, or none
// does, and then they are served in the order listed).
type ShareMember struct {
	User   string `json:"user"`
	Weight int    `json:"weight,omitempty"`
}

// ReservationStatus is where a reservation stands: what the snapshot, the
// FUSE view and the metrics show of it.
type ReservationStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Priority int    `json:"priority"`
	// Reserved is the units set aside now (0 while pending); Held the units
	// held for it while it is pending and first in line.
	Reserved int `json:"reserved"`
	Held     int `json:"held,omitempty"`
	// Stage is the current stage, from 0; Stages how many there are.
	Stage  int `json:"stage"`
	Stages int `json:"stages_total"`
	// Need is this stage's units; InUse what the owner holds of them now.
	Need  int `json:"need"`
	InUse int `json:"in_use"`
	// Lendable is Reserved − Need: what may be lent this stage. Lent is
	// what borrowers hold now, Reclaiming the part of it being taken back
	// (its holders got SIGTERM and have not exited yet).
	Lendable   int `json:"lendable"`
	Lent       int `json:"lent"`
	Reclaiming int `json:"reclaiming,omitempty"`
	// Reclaimed is what was taken back from borrowers when this stage
	// started.
	Reclaimed int `json:"reclaimed"`
}

// Reservation is a workflow reservation as GET /v1/reservations shows it.
type Reservation struct {
	ReservationStatus
	Owner ReservationOwner `json:"owner"`
	// Needs are the stages' units, in order.
	Needs []int         `json:"needs"`
	Share []ShareMember `json:"share,omitempty"`
	// LentTo splits Lent by share member (the member's name as given).
	LentTo  map[string]int `json:"lent_to,omitempty"`
	Created time.Time      `json:"created"`
	// Units are the units set aside (or held), per GPU.
	Units []ReservationUnits `json:"units,omitempty"`
}

// ReservationOwner is who made a reservation.
type ReservationOwner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// ReservationUnits are a reservation's units on one GPU.
type ReservationUnits struct {
	GPU   int    `json:"gpu"`
	UUID  string `json:"uuid"`
	Units []int  `json:"units"`
}

// ReservationList is the body of GET /v1/reservations.
type ReservationList struct {
	Reservations []Reservation `json:"reservations"`
}
