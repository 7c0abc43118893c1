package mpsctl

import (
	"errors"
	"testing"
)

// TestSameStatuses: two lists of equal figures are the same whatever their
// pointers and errors' identities; a change of any field is a change.
func TestSameStatuses(t *testing.T) {
	uid := func(u uint32) *uint32 { return &u }
	base := func() []InstanceStatus {
		return []InstanceStatus{
			{Instance: 0, State: "running", PID: 10, ServerUID: uid(1000), Clients: 2,
				Servers: []Server{{PID: 11, UID: uid(1000), Clients: []int{20, 21}}}},
			{Instance: 1, State: "down", Err: errors.New("control daemon exited")},
		}
	}
	if !SameStatuses(base(), base()) {
		t.Fatal("equal statuses with their own pointers and errors: not the same")
	}
	if !SameStatuses(nil, []InstanceStatus{}) {
		t.Fatal("nil and empty: not the same")
	}
	changes := map[string]func(s []InstanceStatus) []InstanceStatus{
		"one fewer":     func(s []InstanceStatus) []InstanceStatus { return s[:1] },
		"instance":      func(s []InstanceStatus) []InstanceStatus { s[0].Instance = 2; return s },
		"state":         func(s []InstanceStatus) []InstanceStatus { s[0].State = "starting"; return s },
		"pid":           func(s []InstanceStatus) []InstanceStatus { s[0].PID = 12; return s },
		"clients":       func(s []InstanceStatus) []InstanceStatus { s[0].Clients = 3; return s },
		"server uid":    func(s []InstanceStatus) []InstanceStatus { *s[0].ServerUID = 1001; return s },
		"no server uid": func(s []InstanceStatus) []InstanceStatus { s[0].ServerUID = nil; return s },
		"error":         func(s []InstanceStatus) []InstanceStatus { s[1].Err = errors.New("other"); return s },
		"no error":      func(s []InstanceStatus) []InstanceStatus { s[1].Err = nil; return s },
		"server gone":   func(s []InstanceStatus) []InstanceStatus { s[0].Servers = nil; return s },
		"server pid":    func(s []InstanceStatus) []InstanceStatus { s[0].Servers[0].PID = 13; return s },
		"server's uid":  func(s []InstanceStatus) []InstanceStatus { *s[0].Servers[0].UID = 7; return s },
		"server unread": func(s []InstanceStatus) []InstanceStatus { s[0].Servers[0].UID = nil; return s },
		"a client more": func(s []InstanceStatus) []InstanceStatus {
			s[0].Servers[0].Clients = append(s[0].Servers[0].Clients, 22)
			return s
		},
		"another client": func(s []InstanceStatus) []InstanceStatus { s[0].Servers[0].Clients[1] = 23; return s },
		"a server more": func(s []InstanceStatus) []InstanceStatus {
			s[0].Servers = append(s[0].Servers, Server{PID: 14})
			return s
		},
	}
	for name, change := range changes {
		if SameStatuses(base(), change(base())) {
			t.Errorf("%s: the same", name)
		}
	}
}
