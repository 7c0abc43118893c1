package testutil

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// RawConn is the least an HTTP/1.1 client can do on a keep-alive connection:
// write a request's bytes, read the status line, the headers for
// Content-Length, and the body. Benchmarks measure servers with it:
// net/http's client costs several times as much CPU a request (building the
// request and its header maps, two goroutines per connection and the
// hand-offs between them, parsing every header), and on a 2-CPU machine that
// work slows the faster server more, which raised every ratio to a floor (a
// bare server answered about half as many leases a second to it as to this
// one).
type RawConn struct {
	conn net.Conn
	host string
	r    *bufio.Reader
	req  []byte
	body []byte
}

// DialRaw connects to address on network ("unix", "tcp") for requests that
// name host.
func DialRaw(network, address, host string) (*RawConn, error) {
	conn, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &RawConn{conn: conn, host: host, r: bufio.NewReaderSize(conn, 4096)}, nil
}

// Close closes the connection.
func (rc *RawConn) Close() error { return rc.conn.Close() }

// Do sends method path with a JSON body (none when nil) and returns the
// answer's status and body, valid until the next call.
func (rc *RawConn) Do(method, path string, body []byte) (int, []byte, error) {
	rc.req = append(append(append(append(rc.req[:0], method...), ' '), path...), " HTTP/1.1\r\nHost: "...)
	rc.req = append(append(rc.req, rc.host...), "\r\n"...)
	if body != nil {
		rc.req = append(rc.req, "Content-Type: application/json\r\nContent-Length: "...)
		rc.req = strconv.AppendInt(rc.req, int64(len(body)), 10)
		rc.req = append(rc.req, "\r\n"...)
	}
	rc.req = append(append(rc.req, "\r\n"...), body...)
	if _, err := rc.conn.Write(rc.req); err != nil {
		return 0, nil, err
	}
	status, length, err := rc.head()
	if err != nil {
		return 0, nil, err
	}
	rc.body = append(rc.body[:0], make([]byte, length)...)
	if _, err := io.ReadFull(rc.r, rc.body); err != nil {
		return 0, nil, err
	}
	return status, rc.body, nil
}

// head reads an answer's status line and headers; an answer without
// Content-Length must have no body (204), as chunked ones are not read here.
func (rc *RawConn) head() (status, length int, err error) {
	line, err := rc.r.ReadSlice('\n')
	if err != nil {
		return 0, 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, 0, fmt.Errorf("raw client: status line %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, 0, fmt.Errorf("raw client: status line %q", line)
	}
	for {
		line, err := rc.r.ReadSlice('\n')
		if err != nil {
			return 0, 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return status, length, nil
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil || length < 0 {
				return 0, 0, fmt.Errorf("raw client: Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, 0, errors.New("raw client: a chunked answer")
		}
	}
}
