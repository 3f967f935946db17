package timeshard_test

// The harness of the conformance suite (docs/conformance.md): a real timeshard server on the
// embedded store, started by the test as a subprocess of the Python package, a TCP proxy that
// can cut a worker off, and a worker run as a child process that a test can kill.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

// python is the interpreter that has the timeshard package (TIMESHARD_PYTHON, else python3).
func python() string {
	if p := os.Getenv("TIMESHARD_PYTHON"); p != "" {
		return p
	}
	return "python3"
}

var (
	pythonOnce sync.Once
	pythonErr  error
)

// needPython skips the test, saying why, when the timeshard Python package is not importable.
func needPython(t *testing.T) {
	t.Helper()
	pythonOnce.Do(func() {
		out, err := exec.Command(python(), "-c", "import timeshard.cli.main").CombinedOutput()
		if err != nil {
			pythonErr = fmt.Errorf("%s -c 'import timeshard.cli.main': %v: %s", python(), err, strings.TrimSpace(string(out)))
		}
	})
	if pythonErr != nil {
		t.Skipf("no timeshard server to test against (install the Python package, or set TIMESHARD_PYTHON): %v", pythonErr)
	}
}

// cliRun runs the timeshard CLI in dir and returns its stdout.
func cliRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(python(), append([]string{"-m", "timeshard.cli.main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("timeshard %v: %v\n%s\n%s", args, err, out, stderr)
	}
	return string(out)
}

// cleanEnv is the environment without TIMESHARD_ settings (the test chooses its own).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIMESHARD_") {
			env = append(env, kv)
		}
	}
	return env
}

// server is one timeshard node started for a test, stopped at its end.
type server struct {
	Address string
	Dir     string
	cmd     *exec.Cmd
}

// startServer runs `timeshard server --port 0` on a fresh SQLite file in dir, with extra flags,
// and waits for it to say where it serves.
func startServer(t *testing.T, dir string, extra ...string) *server {
	t.Helper()
	needPython(t)
	if dir == "" {
		dir = t.TempDir()
	}
	args := append([]string{
		"-m", "timeshard.cli.main", "server", "--port", "0", "--shards", "8",
		"--store", "sqlite://" + filepath.Join(dir, "ts.db"), "--retry-base", "0.2",
	}, extra...)
	cmd := exec.Command(python(), args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{Dir: dir, cmd: cmd}
	t.Cleanup(func() {
		if t.Failed() { // the server's own account of what went wrong, for a failure in CI
			defer func() {
				log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
				lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
				t.Logf("the server's log, last %d lines:\n%s", min(len(lines), 60), strings.Join(lines[max(0, len(lines)-60):], "\n"))
			}()
		}
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
	})
	found := make(chan string, 1)
	go func() {
		scan := bufio.NewScanner(out)
		for scan.Scan() {
			line := scan.Text()
			fmt.Fprintln(logFile, line)
			if i := strings.Index(line, "serving on "); i >= 0 {
				found <- strings.TrimSpace(line[i+len("serving on "):])
			}
		}
	}()
	select {
	case s.Address = <-found:
	case <-time.After(60 * time.Second):
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		t.Fatalf("the server did not start within 60 s:\n%s", log)
	}
	return s
}

func (s *server) config() timeshard.Config {
	return timeshard.Config{Servers: []string{s.Address}}
}

func newClient(t *testing.T, cfg timeshard.Config) *timeshard.Client {
	t.Helper()
	c, err := timeshard.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// runWorker runs w until the test ends (then shuts it down and waits for it).
func runWorker(t *testing.T, w *timeshard.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it is true or the timeout passes (then the test fails, saying what).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitState waits until the job is in state and returns it.
func waitState(t *testing.T, c *timeshard.Client, jobID string, state timeshard.JobState, timeout time.Duration) *timeshard.Job {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		job, err := c.Get(context.Background(), jobID)
		if err != nil {
			t.Fatalf("get %s: %v", jobID, err)
		}
		if job.GetState() == state {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for job %s to be %s; it is %s, history %v",
				timeout, jobID, state, job.GetState(), job.GetHistory())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// proxy forwards TCP connections to a target until Cut, after which it neither forwards nor
// answers (a partition: calls hang rather than fail). Between Hold and Release it keeps what
// the target sends (answers arrive late, in order, none lost); what the client sends still
// goes through.
type proxy struct {
	Address  string
	target   string
	mu       sync.Mutex
	cut      bool
	held     chan struct{} // non-nil while held: closed at Release
	heldData bool          // something from the target arrived while held
	ln       net.Listener
}

// Hold keeps back what the target sends from now on, until Release.
func (p *proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held, p.heldData = make(chan struct{}), false
	}
}

// Release sends on what was held, and then everything as it comes.
func (p *proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// HeldData says whether the target sent something since Hold.
func (p *proxy) HeldData() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldData
}

// waitUnheld blocks while the proxy holds the target's bytes.
func (p *proxy) waitUnheld() {
	p.mu.Lock()
	held := p.held
	if held != nil {
		p.heldData = true
	}
	p.mu.Unlock()
	if held != nil {
		<-held
	}
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{Address: ln.Addr().String(), target: target, ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(in)
		}
	}()
	return p
}

func (p *proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

func (p *proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *proxy) serve(in net.Conn) {
	defer in.Close()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer out.Close()
	pipe := func(dst, src net.Conn, fromTarget bool) {
		buf := make([]byte, 32*1024)
		for {
			n, err := src.Read(buf)
			if n > 0 && fromTarget {
				p.waitUnheld()
			}
			if n > 0 && !p.isCut() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(out, in, false)
	pipe(in, out, true)
	_ = io.EOF
}
