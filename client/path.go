package client

import "net/url"

// pathSegment escapes an id so that it stays one path segment.
func pathSegment(s string) string { return url.PathEscape(s) }
