package timeshard_test

// The conformance scenarios of docs/conformance.md (C1-C9), the same in every SDK, against a
// real server. Waits poll with a generous deadline; nothing asserts how fast anything is.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

var bg = context.Background()

// TestMain runs this binary as a worker child process when C6 asks for one.
func TestMain(m *testing.M) {
	if os.Getenv("TIMESHARD_CONFORMANCE_CHILD") == "worker" {
		os.Exit(childWorker())
	}
	os.Exit(m.Run())
}

// childWorker runs "c6.hang" jobs: notes the fence in $CHILD_RECORD, then waits (is killed).
func childWorker() int {
	w := timeshard.NewWorker(timeshard.ConfigFromEnv())
	w.Lease = 2 * time.Second
	record := os.Getenv("CHILD_RECORD")
	w.Handle("c6.hang", timeshard.HandlerOptions{Concurrency: 1, Timeout: time.Minute},
		func(ctx context.Context, job *timeshard.JobContext) error {
			line := fmt.Sprintf("%s %d\n", job.JobID, job.Fence)
			if err := os.WriteFile(record, []byte(line), 0o644); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		})
	if err := w.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func newWorker(cfg timeshard.Config) *timeshard.Worker {
	w := timeshard.NewWorker(cfg)
	w.ClaimWait = time.Second
	w.DrainTimeout = 5 * time.Second
	return w
}

// C1: schedule -> run -> succeeded, with the lateness (handler start - run_at) reported.
func TestC1ScheduleRunSucceeded(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	lateness := make(chan time.Duration, 1)
	w.Handle("c1.echo", timeshard.HandlerOptions{Concurrency: 2}, func(ctx context.Context, job *timeshard.JobContext) error {
		if string(job.Payload) != `{"hi":1}` {
			return timeshard.Permanent(fmt.Errorf("payload %q", job.Payload))
		}
		lateness <- job.Lateness()
		return nil
	})
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c1.echo", Payload: []byte(`{"hi":1}`), Delay: 300 * time.Millisecond})
	if err != nil || !done.Created {
		t.Fatalf("schedule: %v %+v", err, done)
	}
	job := waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second)
	late := <-lateness
	if late < 0 {
		t.Fatalf("the handler started %s before run_at", -late)
	}
	if job.GetAttempt() != 1 || len(job.GetHistory()) != 1 || job.GetHistory()[0].GetOutcome() != "succeeded" {
		t.Fatalf("want one succeeded attempt, got %v", job.GetHistory())
	}
	t.Logf("C1 lateness: %.1f ms", float64(late.Microseconds())/1000)
}

// C2: a handler error -> retried with the type's backoff -> succeeded on a later attempt.
func TestC2RetryThenSucceed(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	var attempts []int32
	var mu sync.Mutex
	w.Handle("c2.flaky", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		mu.Lock()
		attempts = append(attempts, job.Attempt)
		mu.Unlock()
		if job.Attempt < 3 {
			return fmt.Errorf("flaky downstream, attempt %d", job.Attempt)
		}
		return nil
	})
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c2.flaky", MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	job := waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 60*time.Second)
	history := job.GetHistory()
	if job.GetAttempt() != 3 || len(history) != 3 {
		t.Fatalf("want 3 attempts, got attempt %d, history %v", job.GetAttempt(), history)
	}
	for i, a := range history[:2] {
		if a.GetOutcome() != "retry" || !strings.Contains(a.GetError(), "flaky downstream") {
			t.Fatalf("attempt %d: %v", i+1, a)
		}
		// The retry came after the failure (the backoff is full jitter: it may be short).
		if history[i+1].GetStartedAt().AsTime().Before(a.GetFinishedAt().AsTime()) {
			t.Fatalf("attempt %d started before attempt %d ended", i+2, i+1)
		}
	}
	if history[2].GetOutcome() != "succeeded" {
		t.Fatalf("last attempt: %v", history[2])
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts) != "[1 2 3]" {
		t.Fatalf("handler saw attempts %v", attempts)
	}
}

// C3: a permanent error -> dead letter with the error text; list, replay and purge it.
func TestC3PermanentDeadLetterReplayPurge(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	var runs atomic.Int32
	w.Handle("c3.bad", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		runs.Add(1)
		return timeshard.Permanent(errors.New("invalid input: no recipient"))
	})
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c3.bad", MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	id := done.Job.GetJobId()
	job := waitState(t, c, id, timeshard.StateDead, 30*time.Second)
	if !strings.Contains(job.GetLastError(), "invalid input: no recipient") || job.GetAttempt() != 1 {
		t.Fatalf("dead job: attempt %d, last error %q", job.GetAttempt(), job.GetLastError())
	}
	dead, _, err := c.DeadLetters(bg, timeshard.DeadLetterQuery{Type: "c3.bad"})
	if err != nil || len(dead) != 1 || dead[0].GetJobId() != id {
		t.Fatalf("dead letters: %v %v", dead, err)
	}
	replayed, err := c.ReplayDeadLetters(bg, []string{id}, "")
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay: %v %v", replayed, err)
	}
	waitFor(t, 30*time.Second, "the replayed job to run and die again", func() bool {
		j, err := c.Get(bg, id)
		return err == nil && runs.Load() == 2 && j.GetState() == timeshard.StateDead
	})
	purged, err := c.PurgeDeadLetters(bg, []string{id}, "")
	if err != nil || len(purged) != 1 || purged[0] != id {
		t.Fatalf("purge: %v %v", purged, err)
	}
	if dead, _, err := c.DeadLetters(bg, timeshard.DeadLetterQuery{Type: "c3.bad"}); err != nil || len(dead) != 0 {
		t.Fatalf("after purge: %v %v", dead, err)
	}
}

// C4: a handler that outlives its lease without being able to heartbeat is cancelled before
// lease - safety margin on the monotonic clock, and the job runs again elsewhere with a
// higher fence.
func TestC4CutOffHandlerCancelledBeforeLease(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	p := startProxy(t, s.Address)

	cut := timeshard.NewWorker(timeshard.Config{Servers: []string{p.Address}})
	cut.ID = "cut-off"
	cut.Lease = 3 * time.Second
	cut.SafetyMargin = 500 * time.Millisecond
	cut.ClaimWait = time.Second
	cut.DiscoverEvery = -1 // only through the proxy
	type firstRun struct {
		fence     int64
		started   time.Time
		cancelled time.Time
		cause     error
	}
	first := make(chan firstRun, 1)
	noticed := make(chan struct{}) // the node has the handler's start notice
	isCut := make(chan struct{})
	cut.Handle("c4.long", timeshard.HandlerOptions{Timeout: time.Minute}, func(ctx context.Context, job *timeshard.JobContext) error {
		started := time.Now()
		// The cut comes once the start notice is in: a lease that runs out without one is a
		// delivery that never started (given back uncounted), not this scenario's attempt.
		select {
		case <-noticed:
		case <-ctx.Done():
		}
		p.Cut() // from now on nothing this worker sends arrives, nor any answer
		close(isCut)
		<-ctx.Done()
		first <- firstRun{job.Fence, started, time.Now(), context.Cause(ctx)}
		return ctx.Err()
	})
	runWorker(t, cut)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c4.long", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	id := done.Job.GetJobId()
	waitStartNoticed(t, c, id)
	close(noticed)
	receiveWithin(t, isCut, 30*time.Second, "the handler to cut the proxy")
	// Read after the cut: no heartbeat gets through any more, so this lease is the last granted.
	running, err := c.Get(bg, id)
	if err != nil || running.GetState() != timeshard.StateRunning {
		t.Fatalf("after the cut: %v %v", running.GetState(), err)
	}
	leaseUntil := running.GetLeaseUntil().AsTime()
	var r firstRun
	select {
	case r = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the cut-off handler was never cancelled")
	}
	if !errors.Is(r.cause, timeshard.ErrLeaseLost) {
		t.Fatalf("cancelled with %v, want ErrLeaseLost", r.cause)
	}
	// The worker's deadline is (claim sent) + lease - margin; the cancel lands there plus the
	// scheduler's delay, which the margin absorbs: the handler has stopped before the lease the
	// server granted ends (one machine: one clock), so no other run can overlap it.
	if !r.cancelled.Before(leaseUntil) {
		t.Fatalf("cancelled at %s, not before lease_until %s", r.cancelled, leaseUntil)
	}
	if r.cancelled.Sub(r.started) < 2*time.Second {
		t.Fatalf("cancelled after %s, before the lease could have run out", r.cancelled.Sub(r.started))
	}

	other := newWorker(s.config())
	second := make(chan int64, 1)
	other.Handle("c4.long", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		if time.Now().Before(leaseUntil) {
			return timeshard.Permanent(errors.New("started before the first lease ended"))
		}
		second <- job.Fence
		return nil
	})
	runWorker(t, other)
	job := waitState(t, c, id, timeshard.StateSucceeded, 60*time.Second)
	if fence := <-second; fence <= r.fence {
		t.Fatalf("second run fence %d, first %d", fence, r.fence)
	}
	if h := job.GetHistory(); len(h) != 2 || h[0].GetOutcome() != "lease expired" {
		t.Fatalf("history: %v", h)
	}
}

// C5: cancel of a running job reaches the handler (the heartbeat answers FAILED_PRECONDITION).
func TestC5CancelReachesHandler(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	w.Lease = 3 * time.Second
	started := make(chan string, 1)
	cause := make(chan error, 1)
	w.Handle("c5.long", timeshard.HandlerOptions{Timeout: time.Minute}, func(ctx context.Context, job *timeshard.JobContext) error {
		started <- job.JobID
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	})
	var events []string
	var mu sync.Mutex
	w.OnEvent = func(kind string, job *timeshard.JobContext, detail string) {
		mu.Lock()
		events = append(events, kind)
		mu.Unlock()
	}
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c5.long"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := c.Cancel(bg, done.Job.GetJobId()); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-cause:
		if !errors.Is(got, timeshard.ErrLeaseLost) {
			t.Fatalf("cause %v", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the cancel never reached the handler")
	}
	waitFor(t, 10*time.Second, "the lost event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(events, ","), timeshard.EventLost)
	})
	job, err := c.Get(bg, done.Job.GetJobId())
	if err != nil || job.GetState() != timeshard.StateCancelled {
		t.Fatalf("job after cancel: %v %v", job.GetState(), err)
	}
}

// C6: a worker killed mid-job -> the job runs again after its lease.
func TestC6KilledWorkerJobRunsAgain(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	record := filepath.Join(t.TempDir(), "child.record")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(cleanEnv(), "TIMESHARD_CONFORMANCE_CHILD=worker", "CHILD_RECORD="+record, "TIMESHARD_SERVER="+s.Address)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "c6.hang", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	id := done.Job.GetJobId()
	var firstFence int64
	waitFor(t, 30*time.Second, "the child worker to start the job", func() bool {
		data, err := os.ReadFile(record)
		fields := strings.Fields(string(data))
		if err != nil || len(fields) != 2 {
			return false
		}
		firstFence, _ = strconv.ParseInt(fields[1], 10, 64)
		return fields[0] == id
	})
	// Killed once its start notice is in: the attempt counts (before it, the job would go back
	// uncounted as a delivery that never started).
	running := waitStartNoticed(t, c, id)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	w := newWorker(s.config())
	again := make(chan *timeshard.JobContext, 1)
	w.Handle("c6.hang", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		again <- job
		return nil
	})
	runWorker(t, w)
	job := waitState(t, c, id, timeshard.StateSucceeded, 60*time.Second)
	second := <-again
	if second.Fence <= firstFence || second.Attempt != 2 {
		t.Fatalf("second run: fence %d (first %d), attempt %d", second.Fence, firstFence, second.Attempt)
	}
	if second.StartedAt.Before(running.GetLeaseUntil().AsTime()) {
		t.Fatalf("ran again at %s, before the first lease ended at %s", second.StartedAt, running.GetLeaseUntil().AsTime())
	}
	if h := job.GetHistory(); len(h) != 2 || h[0].GetOutcome() != "lease expired" {
		t.Fatalf("history: %v", h)
	}
}

// C10: a job whose claim answer reaches the worker after the job's deadline ((claim sent) +
// lease - safety margin) is not started but given back at once, fenced and uncounted: its
// history keeps the delivery as "not started" with the reason, and the job then runs as its
// first attempt (with max attempts 1: a counted delivery would have left it dead).
func TestC10LateClaimAnswerGivenBackUnstarted(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	p := startProxy(t, s.Address)
	w := timeshard.NewWorker(timeshard.Config{Servers: []string{p.Address}})
	w.ID = "slow-link"
	w.Lease = 6 * time.Second
	w.SafetyMargin = 1500 * time.Millisecond
	w.ClaimWait = 2 * time.Second
	w.DiscoverEvery = -1 // only through the proxy
	type event struct{ kind, job, detail string }
	events := make(chan event, 16)
	w.OnEvent = func(kind string, job *timeshard.JobContext, detail string) {
		events <- event{kind, job.JobID, detail}
	}
	runs := make(chan *timeshard.JobContext, 16)
	w.Handle("c10.late", timeshard.HandlerOptions{Concurrency: 1}, func(ctx context.Context, job *timeshard.JobContext) error {
		runs <- job
		return nil
	})
	runWorker(t, w)
	warm, err := c.Schedule(bg, timeshard.NewJob{Type: "c10.late"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, warm.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second) // its polls flow

	id, leaseUntil := claimWithAnswerHeld(t, c, p, "c10.late")
	// Let the answer through after the worker's deadline for it (the claim was sent before the
	// lease began, so that is at most lease_until - margin) and before the lease's end, so the
	// give-back is the worker's own and not the node's expiry of a lease without a notice.
	time.Sleep(time.Until(leaseUntil.Add(-w.SafetyMargin + 300*time.Millisecond)))
	p.Release()

	const why = "not started: lease over before the worker received it"
	for {
		e := receiveWithin(t, events, 30*time.Second, "the late job's event")
		if e.job != id {
			continue
		}
		if e.kind != timeshard.EventNotStarted || e.detail != why {
			t.Fatalf("the late job's first event: %+v", e)
		}
		break
	}
	job := waitState(t, c, id, timeshard.StateSucceeded, 30*time.Second)
	h := job.GetHistory()
	if len(h) != 2 || h[0].GetOutcome() != "not started" || h[0].GetError() != why || h[1].GetOutcome() != "succeeded" {
		t.Fatalf("history: %v", h)
	}
	if job.GetAttempt() != 1 || job.GetUnstarted() != 1 {
		t.Fatalf("attempt %d, unstarted %d; want 1 and 1", job.GetAttempt(), job.GetUnstarted())
	}
	var ran []int32
	for len(runs) > 0 {
		if r := <-runs; r.JobID == id {
			ran = append(ran, r.Attempt)
		}
	}
	if fmt.Sprint(ran) != "[1]" {
		t.Fatalf("the handler ran the job at attempts %v, want [1]", ran)
	}
}

// claimWithAnswerHeld schedules a job of jobType for the worker behind p while p holds what
// the node sends, so the worker's waiting long poll claims it and its answer stays in the
// proxy; it returns the job's id and lease_until. (If that poll ended empty before the job was
// due, its empty answer is held and nothing claims the job: then the job is cancelled, the
// proxy released, and it is tried again.)
func claimWithAnswerHeld(t *testing.T, c *timeshard.Client, p *proxy, jobType string) (string, time.Time) {
	t.Helper()
	for try := 1; try <= 3; try++ {
		p.Hold()
		done, err := c.Schedule(bg, timeshard.NewJob{Type: jobType, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		id := done.Job.GetJobId()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			j, err := c.Get(bg, id)
			if err != nil {
				t.Fatal(err)
			}
			if j.GetState() == timeshard.StateRunning {
				return id, j.GetLeaseUntil().AsTime()
			}
			time.Sleep(20 * time.Millisecond)
		}
		if j, err := c.Cancel(bg, id); err != nil || j.GetState() != timeshard.StateCancelled {
			t.Fatalf("cancel of the job no poll took: %v %v", j.GetState(), err)
		}
		p.Release()
		time.Sleep(500 * time.Millisecond) // the worker polls again
	}
	t.Fatal("no claim took the job while the proxy held the node's answers, in 3 tries")
	return "", time.Time{}
}

// waitStartNoticed waits until the node has the running job's start notice, and returns it.
func waitStartNoticed(t *testing.T, c *timeshard.Client, id string) *timeshard.Job {
	t.Helper()
	var job *timeshard.Job
	waitFor(t, 30*time.Second, "the start notice of job "+id, func() bool {
		j, err := c.Get(bg, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		job = j
		return j.GetState() == timeshard.StateRunning && j.GetStartNoticed()
	})
	return job
}

func receiveWithin[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
		var zero T
		return zero
	}
}

// C8: per-type concurrency respected: never more handlers of a type running at once in one
// worker than its limit, across every node polled.
func TestC8ConcurrencyAcrossNodes(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	// Two addresses of the same node: the worker polls both as two nodes.
	_, port, _ := strings.Cut(s.Address, ":")
	w := newWorker(timeshard.Config{Servers: []string{s.Address, "localhost:" + port}})
	const limit = 3
	var now, peak atomic.Int32
	w.Handle("c8.limited", timeshard.HandlerOptions{Concurrency: limit}, func(ctx context.Context, job *timeshard.JobContext) error {
		n := now.Add(1)
		defer now.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
		return nil
	})
	var jobs []timeshard.NewJob
	for range 30 {
		jobs = append(jobs, timeshard.NewJob{Type: "c8.limited"})
	}
	made, err := c.ScheduleMany(bg, jobs)
	if err != nil || len(made) != 30 {
		t.Fatalf("schedule many: %d %v", len(made), err)
	}
	runWorker(t, w)
	for _, m := range made {
		waitState(t, c, m.Job.GetJobId(), timeshard.StateSucceeded, 60*time.Second)
	}
	if p := peak.Load(); p > limit || w.MaxRunning("c8.limited") > limit {
		t.Fatalf("%d handlers ran at once (worker counted %d), limit %d", p, w.MaxRunning("c8.limited"), limit)
	}
	if peak.Load() < 2 {
		t.Fatalf("peak %d: the limit was never used", peak.Load())
	}
}
