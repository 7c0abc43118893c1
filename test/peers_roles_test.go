package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
)

// The helper roles of the tests in peers_test.go. Each talks HTTP over a
// connection of its own making, so that the test decides which process made
// which connection.

// call sends one request on a connection and says what came back:
// "<status> <code> <message>" (code and message for errors only).
func call(c net.Conn, br *bufio.Reader, method, path, body string) string {
	req, err := http.NewRequest(method, "http://gpulet"+path, strings.NewReader(body))
	if err != nil {
		return "error " + err.Error()
	}
	if err := req.Write(c); err != nil {
		return "error " + err.Error()
	}
	return answer(br, req)
}

// answer reads the answer to req: its status, and for a refusal its error's
// code and message.
func answer(br *bufio.Reader, req *http.Request) string {
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return "error " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 300 {
		return strconv.Itoa(resp.StatusCode)
	}
	var eb api.ErrorBody
	json.Unmarshal(b, &eb)
	return fmt.Sprintf("%d %s %s", resp.StatusCode, eb.Error.Code, eb.Error.Message)
}

func dialSocket() (net.Conn, error) { return net.Dial("unix", os.Getenv("GPULET_SOCKET")) }

// connectorRole connects, hands the connection to a child (the holder role)
// and exits at once, so that the connection outlives the process that made
// it.
func connectorRole() int {
	c, err := dialSocket()
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		fmt.Println("file:", err)
		return 1
	}
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), helperRoleEnv+"=holder")
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.ExtraFiles = []*os.File{f}
	if err := child.Start(); err != nil {
		fmt.Println("holder:", err)
		return 1
	}
	return 0
}

// holderRole waits for a line on stdin, then asks on the connection it was
// given (fd 3) for a lease bound to the caller's own process and to drain
// the node, and prints both answers.
func holderRole() int {
	c, err := net.FileConn(os.NewFile(3, "conn"))
	if err != nil {
		fmt.Println("conn:", err)
		return 1
	}
	fmt.Println("holding")
	bufio.NewReader(os.Stdin).ReadString('\n')
	br := bufio.NewReader(c)
	fmt.Println("lease=" + call(c, br, "POST", "/v1/leases", `{"units":1}`))
	fmt.Println("drain=" + call(c, br, "POST", "/v1/node/drain", ""))
	return 0
}

// requestRole sends GPULET_E2E_METHOD GPULET_E2E_PATH with GPULET_E2E_BODY and
// prints the answer.
func requestRole() int {
	c, err := dialSocket()
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	fmt.Println(call(c, bufio.NewReader(c), os.Getenv("GPULET_E2E_METHOD"), os.Getenv("GPULET_E2E_PATH"), os.Getenv("GPULET_E2E_BODY")))
	return 0
}

// blockRole does nothing until killed: a process of the user, with threads.
func blockRole() int {
	fmt.Println("blocking")
	select {}
}

// hogRole opens GPULET_E2E_CONNS connections and holds them, prints how many
// the daemon kept open and how many it closed at once, and holds the open
// ones until stdin closes.
func hogRole() int {
	n, _ := strconv.Atoi(os.Getenv("GPULET_E2E_CONNS"))
	var conns []net.Conn
	for range n {
		c, err := dialSocket()
		if err != nil {
			fmt.Println("dial:", err)
			return 1
		}
		conns = append(conns, c)
	}
	var mu sync.Mutex
	var open, closed int
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			// A refused connection is closed at once; a kept one stays
			// silent until the read times out.
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(make([]byte, 1))
			mu.Lock()
			defer mu.Unlock()
			if err == io.EOF {
				closed++
			} else {
				open++
			}
		})
	}
	wg.Wait()
	fmt.Printf("open=%d closed=%d\n", open, closed)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// waitersRole queues GPULET_E2E_WAITERS lease requests that wait for units, each on
// its own connection and bound to this process, prints "sent" and its pid,
// and waits for a line on stdin (the test sees them bound); then it asks
// one more and prints the first answer any of them got. It holds the queued
// ones until stdin closes.
func waitersRole() int {
	n, _ := strconv.Atoi(os.Getenv("GPULET_E2E_WAITERS"))
	body := fmt.Sprintf(`{"units":1,"pid":%d,"wait":"1m"}`, os.Getpid())
	// The first answer to any request is the one a cap gives at once: gpuletd
	// opens a request's pidfd just before it queues it, so the test's sign
	// that n wait may come while the last is still on its way, and the extra
	// request may overtake it; then that one is refused instead.
	first := make(chan string, n+1)
	send := func() bool {
		c, err := dialSocket()
		if err != nil {
			fmt.Println("dial:", err)
			return false
		}
		req, _ := http.NewRequest("POST", "http://gpulet/v1/leases", strings.NewReader(body))
		if err := req.Write(c); err != nil {
			fmt.Println("write:", err)
			return false
		}
		go func() { first <- answer(bufio.NewReader(c), req) }()
		return true
	}
	for range n {
		if !send() {
			return 1
		}
	}
	fmt.Println("sent", os.Getpid())
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return 1
	}
	if !send() {
		return 1
	}
	fmt.Println("one more=" + <-first)
	io.Copy(io.Discard, in)
	return 0
}
