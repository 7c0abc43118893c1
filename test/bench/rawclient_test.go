package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
)

// benchClient is one client of a benchmark's team: a keep-alive net/http
// client for the ops that read what they get, and a raw connection for the
// ops whose figures are a server's throughput.
type benchClient struct {
	*http.Client
	sock string
	raw  *rawConn
}

func newBenchClient(sock string) *benchClient {
	return &benchClient{Client: httpClient(sock), sock: sock}
}

func (c *benchClient) close() {
	c.CloseIdleConnections()
	if c.raw != nil {
		c.raw.conn.Close()
	}
}

// rawConn is the least an HTTP/1.1 client can do on a keep-alive Unix socket:
// write a request's bytes, read the status line, the headers for
// Content-Length, and the body. net/http's client costs several times as
// much CPU a request (building the request and its header maps, two
// goroutines per connection and the hand-offs between them, parsing every
// header): on a 2-CPU machine that client's work slows the faster server
// more, and so raised every ratio to a floor (a bare server answered about
// half as many leases a second to it as to this one).
type rawConn struct {
	conn net.Conn
	r    *bufio.Reader
	req  []byte
	body []byte
}

// rawClient is c's raw connection, dialled at first use.
func (c *benchClient) rawClient() (*rawConn, error) {
	if c.raw == nil {
		conn, err := net.Dial("unix", c.sock)
		if err != nil {
			return nil, err
		}
		c.raw = &rawConn{conn: conn, r: bufio.NewReaderSize(conn, 4096)}
	}
	return c.raw, nil
}

// do sends method path with body (none when nil) and returns the answer's
// status and body, valid until the next call.
func (rc *rawConn) do(method, path string, body []byte) (int, []byte, error) {
	rc.req = append(append(append(append(rc.req[:0], method...), ' '), path...), " HTTP/1.1\r\nHost: gpulet\r\n"...)
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
func (rc *rawConn) head() (status, length int, err error) {
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

var (
	leaseRequest = []byte(`{"units":1,"ttl":"1m"}`)
	idField      = []byte(`"id":"`)
)

// leaseRelease is POST /v1/leases for one unit with a ttl, then DELETE of the
// lease it returned, on c's raw connection.
func leaseRelease(c *benchClient) error {
	rc, err := c.rawClient()
	if err != nil {
		return err
	}
	status, body, err := rc.do(http.MethodPost, "/v1/leases", leaseRequest)
	if err != nil {
		return err
	}
	if status != http.StatusCreated {
		return fmt.Errorf("lease: HTTP %d: %s", status, body)
	}
	_, rest, ok := bytes.Cut(body, idField)
	end := bytes.IndexByte(rest, '"')
	if !ok || end <= 0 {
		return fmt.Errorf("lease: no id in %q", body)
	}
	path := "/v1/leases/" + string(rest[:end])
	if status, body, err = rc.do(http.MethodDelete, path, nil); err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("release %s: HTTP %d: %s", path, status, body)
	}
	return nil
}
