package timeshard_test

// Results and waiting against a real server: what a Go handler returns reaches its job (read
// back with Get and through the WaitJobs stream), what can not be stored makes the job dead
// saying why, and failures carry their traceback. (The encoding rules one by one are
// results_internal_test.go.)

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

// A Go handler's JSON result, bytes result and no result reach the job, through Get and
// through Wait; a result that can not be stored makes the job dead at once with the reason.
func TestHandlerResultsReachTheJob(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	w.HandleResult("res.json", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return map[string]any{"echo": string(job.Payload), "sum": 4, "note": "<a&b>"}, nil
	})
	w.HandleResult("res.bytes", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return []byte{0, 1, 2, 0xff}, nil
	})
	w.HandleResult("res.none", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return nil, nil
	})
	w.Handle("res.plain", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		return nil
	})
	w.HandleResult("res.unserialisable", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return map[string]any{"callback": func() {}}, nil
	})
	w.HandleResult("res.big", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return make([]byte, timeshard.MaxResultBytes+1), nil
	})
	runWorker(t, w)
	types := []string{"res.json", "res.bytes", "res.none", "res.plain", "res.unserialisable", "res.big"}
	var jobs []timeshard.NewJob
	for _, typ := range types {
		jobs = append(jobs, timeshard.NewJob{Type: typ, Payload: []byte("hi"), MaxAttempts: 5})
	}
	made, err := c.ScheduleMany(bg, jobs)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{}
	var ids []string
	for i, m := range made {
		id[types[i]] = m.Job.GetJobId()
		ids = append(ids, m.Job.GetJobId())
	}
	done, err := c.WaitMany(bg, ids, 60*time.Second)
	if err != nil || len(done) != len(ids) {
		t.Fatalf("wait many: %d of %d jobs, %v", len(done), len(ids), err)
	}

	jsonJob := done[id["res.json"]]
	if jsonJob.GetState() != timeshard.StateSucceeded || jsonJob.GetResultEncoding() != "json" ||
		string(jsonJob.GetResult()) != `{"echo":"hi","note":"<a&b>","sum":4}` {
		t.Fatalf("json result through the wait: %s %q %q", jsonJob.GetState(), jsonJob.GetResultEncoding(), jsonJob.GetResult())
	}
	got, err := c.Get(bg, id["res.json"])
	if err != nil || got.GetResultEncoding() != "json" || string(got.GetResult()) != string(jsonJob.GetResult()) {
		t.Fatalf("json result through Get: %q %q %v", got.GetResultEncoding(), got.GetResult(), err)
	}
	var decoded struct {
		Echo string
		Sum  int
	}
	if err := timeshard.DecodeResult(got, &decoded); err != nil || decoded.Echo != "hi" || decoded.Sum != 4 {
		t.Fatalf("decoded %+v, %v", decoded, err)
	}

	bytesJob, err := c.Wait(bg, id["res.bytes"], 10*time.Second)
	if err != nil || bytesJob.GetResultEncoding() != "bytes" || string(bytesJob.GetResult()) != "\x00\x01\x02\xff" {
		t.Fatalf("bytes result through Wait: %v %q %q", err, bytesJob.GetResultEncoding(), bytesJob.GetResult())
	}
	if got, err := c.Get(bg, id["res.bytes"]); err != nil || string(got.GetResult()) != "\x00\x01\x02\xff" {
		t.Fatalf("bytes result through Get: %v %v", got, err)
	}
	if err := timeshard.DecodeResult(bytesJob, &decoded); err == nil || !strings.Contains(err.Error(), "bytes, not JSON") {
		t.Fatalf("decoding a bytes result: %v", err)
	}
	for _, typ := range []string{"res.none", "res.plain"} {
		job := done[id[typ]]
		if job.GetState() != timeshard.StateSucceeded || job.GetResultEncoding() != "" || len(job.GetResult()) != 0 {
			t.Fatalf("%s: %s with %q %q", typ, job.GetState(), job.GetResultEncoding(), job.GetResult())
		}
		if err := timeshard.DecodeResult(job, &decoded); !errors.Is(err, timeshard.ErrNoResult) {
			t.Fatalf("%s: decoding no result: %v", typ, err)
		}
	}

	for typ, want := range map[string]string{
		"res.unserialisable": "ResultError: the handler returned a map[string]interface {} that is not JSON-serialisable",
		"res.big":            "ResultError: the handler's result is 262145 bytes, over the limit of 262144 bytes; keep large output elsewhere and return a reference to it",
	} {
		job := done[id[typ]]
		// Dead after one attempt though four remained: a retry would only repeat its effects.
		if job.GetState() != timeshard.StateDead || job.GetAttempt() != 1 || !strings.HasPrefix(job.GetLastError(), want) {
			t.Fatalf("%s: %s at attempt %d, last error %q", typ, job.GetState(), job.GetAttempt(), job.GetLastError())
		}
		if len(job.GetResult()) != 0 || job.GetResultEncoding() != "" {
			t.Fatalf("%s kept a result: %q", typ, job.GetResultEncoding())
		}
	}
}

// stackErr prints a stack with %+v, as errors from github.com/pkg/errors and the like do.
type stackErr struct{ msg string }

func (e stackErr) Error() string { return e.msg }
func (e stackErr) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('+') {
		fmt.Fprintf(f, "%s\nbilling.charge\n\t/src/billing/charge.go:42", e.msg)
		return
	}
	fmt.Fprint(f, e.msg)
}

// A returned error's attempt keeps its %+v as the traceback when that says more than its
// text (an error with a stack), and no traceback when it does not.
func TestReturnedErrorsTraceback(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	w.Handle("tb.stack", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		return timeshard.Permanent(stackErr{"card declined"})
	})
	w.Handle("tb.plain", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		return timeshard.Permanent(errors.New("no recipient"))
	})
	runWorker(t, w)
	made, err := c.ScheduleMany(bg, []timeshard.NewJob{{Type: "tb.stack"}, {Type: "tb.plain"}})
	if err != nil {
		t.Fatal(err)
	}
	withStack, err := c.Wait(bg, made[0].Job.GetJobId(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h := withStack.GetHistory()
	if withStack.GetState() != timeshard.StateDead || len(h) != 1 || h[0].GetError() != "card declined" ||
		h[0].GetTraceback() != "card declined\nbilling.charge\n\t/src/billing/charge.go:42" {
		t.Fatalf("an error with a stack: %s, history %v", withStack.GetState(), h)
	}
	plain, err := c.Wait(bg, made[1].Job.GetJobId(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if h := plain.GetHistory(); len(h) != 1 || h[0].GetError() != "no recipient" || h[0].GetTraceback() != "" {
		t.Fatalf("a plain error: history %v", h)
	}
}

// Wait: an unknown id is NotFound; a job not finished within the timeout is a
// *WaitTimeoutError naming it; ctx bounds a wait without a timeout of its own; a finished job
// is returned at once; AsFinished yields each job when it finishes, not when all have.
func TestWaitForJobs(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())

	if _, err := c.Wait(bg, "no-such-job", time.Second); !errors.Is(err, timeshard.ErrNotFound) || !strings.Contains(err.Error(), "no-such-job") {
		t.Fatalf("wait for an unknown id: %v", err)
	}
	later, err := c.Schedule(bg, timeshard.NewJob{Type: "wait.later", Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	laterID := later.Job.GetJobId()
	start := time.Now()
	_, err = c.Wait(bg, laterID, 300*time.Millisecond)
	var timedOut *timeshard.WaitTimeoutError
	if !errors.As(err, &timedOut) || !errors.Is(err, timeshard.ErrDeadlineExceeded) {
		t.Fatalf("a wait past its timeout: %v", err)
	}
	if fmt.Sprint(timedOut.Pending) != "["+laterID+"]" || timedOut.Timeout != 300*time.Millisecond {
		t.Fatalf("the timeout error names %v after %s", timedOut.Pending, timedOut.Timeout)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("gave up after %s, before its timeout", waited)
	}
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(ctx, laterID, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait bounded by its context: %v", err)
	}
	if _, err := c.Cancel(bg, laterID); err != nil {
		t.Fatal(err)
	}
	if job, err := c.Wait(bg, laterID, time.Second); err != nil || job.GetState() != timeshard.StateCancelled {
		t.Fatalf("wait for a cancelled job: %v %v", job, err)
	}

	// One job held in its handler until the other has come out of the wait.
	release := make(chan struct{})
	w := newWorker(s.config())
	w.HandleResult("wait.slow", timeshard.HandlerOptions{Timeout: time.Minute}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		select {
		case <-release:
			return "slow", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	w.HandleResult("wait.quick", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
		return "quick", nil
	})
	runWorker(t, w)
	made, err := c.ScheduleMany(bg, []timeshard.NewJob{{Type: "wait.slow"}, {Type: "wait.quick"}})
	if err != nil {
		t.Fatal(err)
	}
	slow, quick := made[0].Job.GetJobId(), made[1].Job.GetJobId()
	var order []string
	for job, err := range c.AsFinished(bg, []string{slow, quick, slow}, 60*time.Second) {
		if err != nil {
			t.Fatalf("as finished, after %v: %v", order, err)
		}
		var result string
		if err := timeshard.DecodeResult(job, &result); err != nil {
			t.Fatal(err)
		}
		order = append(order, result)
		if job.GetJobId() == quick {
			close(release)
		}
	}
	if fmt.Sprint(order) != "[quick slow]" {
		t.Fatalf("finished in the order %v", order)
	}

	// WaitMany past its timeout: the jobs finished so far, and the error naming the rest.
	pending, err := c.Schedule(bg, timeshard.NewJob{Type: "wait.later", Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.WaitMany(bg, []string{quick, pending.Job.GetJobId()}, 300*time.Millisecond)
	if !errors.As(err, &timedOut) || fmt.Sprint(timedOut.Pending) != "["+pending.Job.GetJobId()+"]" {
		t.Fatalf("wait many past its timeout: %v", err)
	}
	if len(done) != 1 || done[quick].GetState() != timeshard.StateSucceeded {
		t.Fatalf("the finished job was not returned with the timeout: %v", done)
	}
}
