package collector

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodEnv makes the test binary the flooding client of
// BenchmarkPlacementsUnderIngest/frag-flooded: a process of its own, as a
// client is (on another machine, usually). In the collector's process its
// goroutines would queue in the collector's scheduler beside the
// collector's own, which no remote client's do; in a process of its own it
// still takes its share of the machine's CPUs.
const floodEnv = "GPULET_COLLECTOR_TEST_FLOOD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(floodEnv); spec != "" {
		os.Exit(runFlood(spec))
	}
	os.Exit(m.Run())
}

// floodSpec is what the flooding process is told: where to ask, as whom,
// how many requests at once, and the bodies to ask with in turn.
type floodSpec struct {
	URL     string   `json:"url"`
	Token   string   `json:"token"`
	Workers int      `json:"workers"`
	Bodies  []string `json:"bodies"`
}

// runFlood floods spec.URL with placement requests, each of spec.Workers
// on a connection of its own asking again as soon as it is answered or
// refused, from when it says "flooding" until its stdin closes; then it
// says how many were answered and refused, and over how many seconds.
func runFlood(spec string) int {
	var fs floodSpec
	if err := json.Unmarshal([]byte(spec), &fs); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		return 2
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: fs.Workers}}
	var answered, refused atomic.Int64
	var stopped atomic.Bool
	var failed atomic.Value
	var wg sync.WaitGroup
	began := time.Now()
	for w := range fs.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stopped.Load(); i++ {
				req, _ := http.NewRequest("POST", fs.URL+"/v1/placements", strings.NewReader(fs.Bodies[i%len(fs.Bodies)]))
				req.Header.Set("Authorization", "Bearer "+fs.Token)
				resp, err := client.Do(req)
				if err != nil {
					failed.Store(err.Error())
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					answered.Add(1)
				case 429:
					refused.Add(1)
				default:
					failed.Store(resp.Status)
					return
				}
			}
		}()
	}
	fmt.Println("flooding")
	_, _ = io.Copy(io.Discard, os.Stdin)
	stopped.Store(true)
	wg.Wait()
	if err, ok := failed.Load().(string); ok {
		fmt.Fprintln(os.Stderr, "flood:", err)
		return 1
	}
	fmt.Printf("flooded %d %d %f\n", answered.Load(), refused.Load(), time.Since(began).Seconds())
	return 0
}

// floodProcess is a flooding client running.
type floodProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startFlood starts a flooding client of url with workers requests at once
// and returns once it floods.
func startFlood(b *testing.B, url string, workers int, bodies []string) *floodProcess {
	b.Helper()
	spec, err := json.Marshal(floodSpec{URL: url, Token: "f100d", Workers: workers, Bodies: bodies})
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), floodEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	f := &floodProcess{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	if line, err := f.out.ReadString('\n'); err != nil || line != "flooding\n" {
		f.stdin.Close()
		_ = cmd.Wait()
		b.Fatalf("the flooding client: %q, %v", line, err)
	}
	return f
}

// stop ends the flood and returns its placements answered and refused a
// second.
func (f *floodProcess) stop(b *testing.B) (answered, refused float64) {
	b.Helper()
	f.stdin.Close()
	line, _ := f.out.ReadString('\n')
	if err := f.cmd.Wait(); err != nil {
		b.Fatalf("the flooding client: %v", err)
	}
	var a, r int64
	var seconds float64
	if _, err := fmt.Sscanf(line, "flooded %d %d %f", &a, &r, &seconds); err != nil {
		b.Fatalf("the flooding client said %q: %v", line, err)
	}
	return float64(a) / seconds, float64(r) / seconds
}
