package timeshard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Shutdown: stop claiming, a bounded drain, then the handler's context is cancelled and its
// job given back: scheduled again at once, the attempt not counted.
func TestShutdownGivesBackAfterDrain(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	w.DrainTimeout = 300 * time.Millisecond
	started := make(chan struct{}, 1)
	cause := make(chan error, 1)
	w.Handle("shutdown.long", timeshard.HandlerOptions{Timeout: time.Minute}, func(ctx context.Context, job *timeshard.JobContext) error {
		started <- struct{}{}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	})
	stop := runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "shutdown.long", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	stop()
	if got := <-cause; !errors.Is(got, timeshard.ErrShutdown) {
		t.Fatalf("cause %v", got)
	}
	job, err := c.Get(bg, done.Job.GetJobId())
	if err != nil {
		t.Fatal(err)
	}
	// With max_attempts 1 a counted failure would have made it dead.
	if job.GetState() != timeshard.StateScheduled || job.GetAttempt() != 0 {
		t.Fatalf("after shutdown: state %s attempt %d", job.GetState(), job.GetAttempt())
	}
	next := newWorker(s.config())
	next.Handle("shutdown.long", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error { return nil })
	runWorker(t, next)
	waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second)
}

// A panicking handler fails its attempt (retried) and the worker goes on; the attempt keeps
// the panic as its error and the panic with its stack as its traceback.
func TestPanicIsARetryableFailure(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	w := newWorker(s.config())
	w.Handle("panics", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
		if job.Attempt == 1 {
			panic("boom")
		}
		return nil
	})
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "panics", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	job := waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second)
	h := job.GetHistory()
	if len(h) != 2 || h[0].GetOutcome() != "retry" {
		t.Fatalf("history %v", h)
	}
	if h[0].GetError() != "panic: boom" {
		t.Fatalf("the panicked attempt's error: %q", h[0].GetError())
	}
	// Where it panicked: this test's handler, in the stack below the panic's value.
	tb := h[0].GetTraceback()
	if !strings.HasPrefix(tb, "panic: boom\n\ngoroutine ") || !strings.Contains(tb, "TestPanicIsARetryableFailure") {
		t.Fatalf("the panicked attempt's traceback: %q", tb)
	}
	if h[1].GetTraceback() != "" {
		t.Fatalf("the succeeded attempt has a traceback: %q", h[1].GetTraceback())
	}
}

// Errors: every status the server answers maps to its sentinel, and only to it.
func TestErrorsMatchTheirStatus(t *testing.T) {
	cases := map[codes.Code]error{
		codes.NotFound:           timeshard.ErrNotFound,
		codes.InvalidArgument:    timeshard.ErrInvalidArgument,
		codes.FailedPrecondition: timeshard.ErrFailedPrecondition,
		codes.AlreadyExists:      timeshard.ErrAlreadyExists,
		codes.Unavailable:        timeshard.ErrUnavailable,
		codes.Unauthenticated:    timeshard.ErrUnauthenticated,
		codes.PermissionDenied:   timeshard.ErrPermissionDenied,
	}
	for code, want := range cases {
		err := error(&timeshard.Error{Code: code, Message: "m"})
		for _, other := range cases {
			if errors.Is(err, other) != (other == want) {
				t.Errorf("%s: errors.Is(%v) = %v", code, other, !(other == want))
			}
		}
		if status.Code(err) != code {
			t.Errorf("%s: status.Code gives %s", code, status.Code(err))
		}
	}
	perm := timeshard.Permanent(errors.New("bad input"))
	var p *timeshard.PermanentError
	if !errors.As(perm, &p) || perm.Error() != "bad input" {
		t.Fatalf("Permanent: %v", perm)
	}
}

// Bad TLS settings are a clear error when the client is made, not a failure at the first call.
func TestBadTLSDirIsAClearError(t *testing.T) {
	_, err := timeshard.NewClient(timeshard.Config{TLSDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "ca.pem") {
		t.Fatalf("want an error naming ca.pem, got %v", err)
	}
	w := timeshard.NewWorker(timeshard.Config{TLSDir: "/no/such/dir"})
	w.Handle("x", timeshard.HandlerOptions{}, func(context.Context, *timeshard.JobContext) error { return nil })
	if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "/no/such/dir") {
		t.Fatalf("worker: want an error naming the dir, got %v", err)
	}
}
