package mpsctl

import "slices"

// SameStatuses says whether a and b show the same instances: every field
// alike, a pointer's value rather than its address, an error by its message
// (all a snapshot shows of it). The snapshot's build asks it for every GPU
// at every build, so it compares without reflection.
func SameStatuses(a, b []InstanceStatus) bool {
	return slices.EqualFunc(a, b, sameStatus)
}

func sameStatus(a, b InstanceStatus) bool {
	return a.Instance == b.Instance && a.State == b.State && a.PID == b.PID && a.Clients == b.Clients &&
		sameUID(a.ServerUID, b.ServerUID) && errText(a.Err) == errText(b.Err) &&
		slices.EqualFunc(a.Servers, b.Servers, sameServer)
}

func sameServer(a, b Server) bool {
	return a.PID == b.PID && sameUID(a.UID, b.UID) && slices.Equal(a.Clients, b.Clients)
}

func sameUID(a, b *uint32) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// errText is err's message, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
