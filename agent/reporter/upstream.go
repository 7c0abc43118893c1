package reporter

import (
	"fmt"
	"net/url"
)

// Upstream is an --upstream URL, checked once, when parsed: an http or
// https URL with a host. It prints as it may be shown (String), so that no
// log line or error formatting one shows its credentials.
type Upstream struct {
	// url is the URL as given, credentials included: where pushes go.
	url   string
	shown string
	// tls: reached over https; userinfo: the URL carries credentials.
	tls, userinfo bool
}

// ParseUpstream reads an --upstream value. Its error names the flag and the
// value, redacted.
func ParseUpstream(raw string) (Upstream, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Upstream{}, fmt.Errorf("--upstream %q: want an http:// or https:// URL with a host, such as http://scheduler:8080/v1/snapshots", RedactURL(raw))
	}
	return Upstream{url: raw, shown: RedactURL(raw), tls: u.Scheme == "https", userinfo: u.User != nil}, nil
}

// String is the URL as it may be shown (RedactURL): upstreams are told
// apart by it wherever they are shown.
func (u Upstream) String() string { return u.shown }

// fullDetail reports whether the upstream may be pushed the snapshot with
// its uids and reservation names: it is reached over TLS, or with
// credentials (a token file, which credentials says, or userinfo in the
// URL). Others get it redacted.
func (u Upstream) fullDetail(credentials bool) bool { return u.tls || u.userinfo || credentials }

// RedactURL is raw as it may be shown (status, snapshot, view, logs,
// metrics): its userinfo and query, where credentials go, replaced by
// "redacted". A URL that does not parse is shown as "(unparsable URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	u.ForceQuery = false
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
