package timeshard

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
	"unicode/utf8"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ErrLeaseLost is the cause (context.Cause) of a handler's context cancelled because the job is
// no longer this worker's: its lease was not extended in time, or the node refused it
// (cancelled, claimed by another worker). Write nothing more.
var ErrLeaseLost = errors.New("timeshard: the job's lease is lost")

// ErrShutdown is the cause of a handler's context cancelled because the worker shuts down and
// the drain time is over; the job is given back once the handler returns.
var ErrShutdown = errors.New("timeshard: the worker is shutting down")

// ErrTimeout is the cause of a handler's context cancelled at its type's timeout.
var ErrTimeout = errors.New("timeshard: the handler's timeout passed")

// maxErrorBytes: error text is cut to this many bytes (the server's limit).
const maxErrorBytes = 4000

// PermanentError marks a handler's error as one that retrying can not help: the job goes to the
// dead-letter queue with its text.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the job fails permanently (no retry; dead letter).
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

// JobContext is the job a handler runs.
type JobContext struct {
	JobID       string
	Type        string
	Payload     []byte
	Attempt     int32
	MaxAttempts int32
	// Fence names this attempt's lease: pass it (and IdempotencyKey) to external systems that
	// must refuse a stale writer.
	Fence          int64
	IdempotencyKey string
	RunAt          time.Time // when the job was due
	StartedAt      time.Time // when its handler started, on this machine's clock
	WorkerID       string

	lease *lease
}

// Lateness is the handler's start minus the job's run_at.
func (j *JobContext) Lateness() time.Duration { return j.StartedAt.Sub(j.RunAt) }

// Check returns ErrLeaseLost once the job is no longer this worker's, read from the monotonic
// clock when called (so a process paused past its lease sees it at once): call it before each
// step with an effect.
func (j *JobContext) Check() error {
	if j.lease == nil || !j.lease.held() {
		return ErrLeaseLost
	}
	return nil
}

// lease is a claimed job's lease as this worker sees it: a deadline on the monotonic clock
// (time.Time values from time.Now carry a monotonic reading, and comparisons use it), moved on
// by each granted heartbeat, never back.
type lease struct {
	mu       sync.Mutex
	deadline time.Time
	lost     bool
	reason   string
}

func (l *lease) held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && time.Now().Before(l.deadline)
}

func (l *lease) until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

func (l *lease) extend(deadline time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if deadline.After(l.deadline) {
		l.deadline = deadline
	}
}

func (l *lease) lose(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost, l.reason = true, reason
}

func (l *lease) why() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason != "" {
		return l.reason
	}
	return "the lease deadline passed (not extended in time)"
}

// leaseContext is a handler's context: its Err also reads the lease's deadline from the clock
// when asked, so a handler that checks ctx.Err() after this process was paused past the lease
// sees it before its next step, even before the timer goroutine has run.
type leaseContext struct {
	context.Context
	lease  *lease
	cancel context.CancelCauseFunc
}

func (c *leaseContext) Err() error {
	if !c.lease.held() {
		c.cancel(ErrLeaseLost)
	}
	return c.Context.Err()
}

// run is one claimed job in this worker.
type run struct {
	job       *JobContext
	spec      *handlerSpec
	node      *node
	lease     *lease
	ctx       *leaseContext
	returned  chan struct{} // closed when the handler has really returned
	stopTimer context.CancelFunc
}

// start runs one claimed job, or gives it back unstarted when this worker does not run it
// (whyNotStart): then no step of its handler is taken, and the job goes back to the node at
// once, uncounted, rather than waiting out its lease. ctx is the claim loop's: done once the
// worker stops.
func (w *Worker) start(ctx context.Context, n *node, spec *handlerSpec, claimed *pb.ClaimedJob, sent time.Time) {
	leaseEnd := sent.Add(claimed.GetLease().AsDuration())
	deadline := leaseEnd.Add(-w.SafetyMargin)
	job := claimed.GetJob()
	l := &lease{deadline: deadline}
	jc := &JobContext{
		JobID:          job.GetJobId(),
		Type:           job.GetType(),
		Payload:        job.GetPayload(),
		Attempt:        job.GetAttempt(),
		MaxAttempts:    job.GetMaxAttempts(),
		Fence:          claimed.GetFence(),
		IdempotencyKey: claimed.GetIdempotencyKey(),
		RunAt:          job.GetRunAt().AsTime(),
		WorkerID:       w.ID,
		lease:          l,
	}
	if why := w.whyNotStart(ctx, spec, jc, deadline); why != "" {
		spec.slots.release() // nothing runs: the slot is free at once
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.giveBackUnstarted(n, jc, leaseEnd, why)
		}()
		return
	}
	base, cancel := context.WithCancelCause(context.Background())
	timed, stopTimer := context.WithTimeoutCause(base, spec.opts.Timeout, ErrTimeout)
	r := &run{
		job:       jc,
		spec:      spec,
		node:      n,
		lease:     l,
		ctx:       &leaseContext{Context: timed, lease: l, cancel: cancel},
		returned:  make(chan struct{}),
		stopTimer: stopTimer,
	}
	w.mu.Lock()
	w.running[r] = struct{}{}
	w.mu.Unlock()
	w.wg.Add(1)
	go w.execute(r)
}

// The reasons a claimed job is given back unstarted (FinishItem.error).
const (
	whyLate     = "not started: lease over before the worker received it"
	whyTooClose = "not started: less than the safety margin of its lease left when the worker received it"
	whyStopping = "not started: the worker was stopping"
)

// whyNotStart says why a claimed job is not to be started ("" when it is): the worker is
// stopping; no handler of its type here; its deadline ((claim sent) + lease - margin) already
// passed when the answer was read (this process was paused, the answer was slow), or less than
// the safety margin is left before it — a handler then could barely start before it had to be
// stopped, and the job is better given to a worker that has the time.
func (w *Worker) whyNotStart(ctx context.Context, spec *handlerSpec, job *JobContext, deadline time.Time) string {
	left := time.Until(deadline)
	switch {
	case ctx.Err() != nil:
		return whyStopping
	case job.Type != spec.jobType:
		return fmt.Sprintf("not started: the worker has no handler for type %q", job.Type)
	case left <= 0:
		return whyLate
	case left < w.SafetyMargin:
		return whyTooClose
	}
	return ""
}

// giveBackTry bounds one try to give a job back once its lease is over (the node then gives
// it back itself, uncounted, so one try is enough).
const giveBackTry = 5 * time.Second

// giveBackUnstarted sends a job this worker did not start back to the node: a Finish item
// with give_back and not_started (failed too, for a node that predates both), fenced as any
// result. The node schedules it again at once without counting an attempt. Retried on
// UNAVAILABLE (and the like) on the job's node and then the others until the lease's end
// (leaseEnd: (claim sent) + lease, the earliest the node's lease can end); refused (a stale
// fence: the node already took it back itself) it is left there.
func (w *Worker) giveBackUnstarted(home *node, job *JobContext, leaseEnd time.Time, why string) {
	w.Logger.Warn("timeshard worker: a claimed job is given back unstarted", "job", job.JobID, "why", why)
	item := &pb.FinishItem{
		JobId: job.JobID, Fence: job.Fence,
		Failed: true, GiveBack: true, NotStarted: true, Error: why,
	}
	targets := w.targets(home)
	backoff := 50 * time.Millisecond
	for i := 0; ; i++ {
		ctx, cancel := context.WithDeadline(context.Background(), later(leaseEnd, time.Now().Add(giveBackTry)))
		res, err := targets[i%len(targets)].finish(ctx, item)
		cancel()
		code := codeOf(err)
		if err == nil {
			code = codes.Code(res.GetCode())
		}
		retry := code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Aborted
		switch {
		case code == codes.OK:
			w.emitJob(EventNotStarted, job, why)
			return
		case retry && time.Now().Add(backoff).Before(leaseEnd):
			time.Sleep(backoff)
			backoff = min(2*time.Second, backoff*2)
		default:
			detail := res.GetMessage()
			if err != nil {
				detail = err.Error()
			}
			w.emitJob(EventNotStarted, job, fmt.Sprintf("%s; the give-back was not taken (%s): %s", why, code, detail))
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (w *Worker) emit(kind string, r *run, detail string) {
	w.emitJob(kind, r.job, detail)
}

func (w *Worker) emitJob(kind string, job *JobContext, detail string) {
	if w.OnEvent != nil {
		w.OnEvent(kind, job, detail)
	}
}

// execute calls the handler, keeps its lease meanwhile, and reports how it ended. The first
// heartbeat is the start notice, sent as the handler starts (not awaited by it).
func (w *Worker) execute(r *run) {
	defer w.wg.Done()
	defer func() {
		w.mu.Lock()
		delete(w.running, r)
		w.mu.Unlock()
	}()
	defer r.stopTimer()
	defer r.ctx.cancel(context.Canceled)
	result := make(chan ended, 1)
	r.job.StartedAt = time.Now()
	w.emit(EventStarted, r, "")
	go func() {
		defer r.spec.slots.release() // the slot is free only once the handler really returned
		defer close(r.returned)
		result <- w.call(r)
	}()
	keeping := make(chan struct{})
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		w.keepLease(r, keeping)
	}()
	defer func() {
		close(keeping)
		<-kept
	}()

	var out ended
	returned := false
	select {
	case out = <-result:
		returned = true
	case <-r.ctx.Done():
		select { // a handler that returned at the same moment
		case out = <-result:
			returned = true
		default:
		}
	}
	cause := context.Cause(r.ctx)
	switch {
	case !r.lease.held() || errors.Is(cause, ErrLeaseLost):
		w.emit(EventLost, r, r.lease.why()+"; handler stopped")
		return
	case returned && out.err == nil:
	case errors.Is(cause, ErrShutdown):
		w.giveBack(r)
		return
	case errors.Is(cause, ErrTimeout):
		// A cooperative handler stops at once; one that does not is left to its lease (it
		// may still act, so no result of ours lets another attempt start).
		select {
		case <-r.returned:
		case <-time.After(w.SafetyMargin):
			w.emit(EventLost, r, "timed out and did not stop; left to its lease")
			return
		}
		w.report(r, &pb.FinishItem{Failed: true, Error: fmt.Sprintf("timed out after %s", r.spec.opts.Timeout)})
		return
	}
	item := &pb.FinishItem{Traceback: out.traceback}
	var permanent *PermanentError
	switch {
	case out.err == nil:
		item.Result, item.ResultEncoding = out.result, out.encoding
	case errors.As(out.err, &permanent):
		item.Failed, item.Permanent, item.Error = true, true, truncateError(out.err.Error())
	default:
		item.Failed, item.Error = true, truncateError(out.err.Error())
	}
	w.report(r, item)
}

// ended is how a handler ended: its error (nil: it returned) with the traceback that goes with
// it, or its result, encoded.
type ended struct {
	err       error
	traceback string
	result    []byte
	encoding  string
}

// call runs the handler and encodes what it returned. A panic is an error (the attempt fails
// and is retried; its traceback is the panic's value and stack), never the end of the worker.
// A result that can not be stored is a permanent failure.
func (w *Worker) call(r *run) (out ended) {
	defer func() {
		if p := recover(); p != nil {
			out = ended{
				err:       fmt.Errorf("panic: %v", p),
				traceback: truncateTraceback(fmt.Sprintf("panic: %v\n\n%s", p, debug.Stack())),
			}
		}
	}()
	value, err := r.spec.fn(r.ctx, r.job)
	if err != nil {
		return ended{err: err, traceback: tracebackOf(err)}
	}
	data, encoding, err := encodeResult(value)
	if err != nil {
		return ended{err: Permanent(err)}
	}
	return ended{result: data, encoding: encoding}
}

// giveBack: the worker shut down and stopped the handler; once it has returned, the job is
// given back (scheduled again at once, the attempt not counted). A handler that does not return
// within StopGrace may still act: its job is left to its lease.
func (w *Worker) giveBack(r *run) {
	select {
	case <-r.returned:
	case <-time.After(StopGrace):
		w.emit(EventLost, r, "did not stop at shutdown; left to its lease")
		return
	}
	w.report(r, &pb.FinishItem{Failed: true, GiveBack: true, Error: "worker shut down"})
}

// report sends the result, on the job's node first and then the others, with backoff, until it
// is in or the lease is over (heartbeats go on meanwhile). Nothing is sent once the lease is
// over: the job may be someone else's.
func (w *Worker) report(r *run, item *pb.FinishItem) {
	item.JobId, item.Fence = r.job.JobID, r.job.Fence
	targets := w.targets(r.node)
	backoff := 50 * time.Millisecond
	for i := 0; ; i++ {
		if !r.lease.held() {
			w.emit(EventLost, r, "the lease ended before the result was in; "+r.lease.why())
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), r.lease.until())
		res, err := targets[i%len(targets)].finish(ctx, item)
		cancel()
		code := codeOf(err)
		if err == nil {
			code = codes.Code(res.GetCode())
		}
		switch {
		case code == codes.OK:
			w.emitResult(r, item, res)
			return
		case code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Aborted:
			time.Sleep(backoff)
			backoff = min(2*time.Second, backoff*2)
		default:
			detail := res.GetMessage()
			if err != nil {
				detail = err.Error()
			}
			w.emit(EventLost, r, fmt.Sprintf("result refused (%s): %s", code, detail))
			return
		}
	}
}

func (w *Worker) emitResult(r *run, item *pb.FinishItem, res *pb.FinishResult) {
	switch {
	case item.GiveBack:
		w.emit(EventGivenBack, r, "")
	case !item.Failed:
		w.emit(EventSucceeded, r, "")
	case res.GetState() == pb.JobState_JOB_STATE_DEAD:
		w.emit(EventDead, r, item.Error)
	default:
		w.emit(EventFailed, r, item.Error)
	}
}

// keepLease sends a heartbeat at once (the start notice: the node counts the attempt from it)
// and then every third of the lease, until stop is closed (the result is in), and cancels the
// handler once the lease is over: not extended before its deadline, or refused (stale fence,
// job gone). Every heartbeat says the handler started, so whichever arrives first is the notice.
func (w *Worker) keepLease(r *run, stop <-chan struct{}) {
	every := w.Lease / 3
	next := time.Now()
	failures := 0
	for {
		if !r.lease.held() {
			r.ctx.cancel(ErrLeaseLost)
			return
		}
		wake := next
		if d := r.lease.until(); d.Before(wake) {
			wake = d
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}
		if !r.lease.held() || time.Now().Before(next) {
			continue // (a pause past the deadline ends here: no heartbeat once it is over)
		}
		sent := time.Now()
		resp, err := w.heartbeat(r, failures, stop)
		if err != nil {
			if errors.Is(err, errStopped) {
				return
			}
			if c := codeOf(err); c == codes.FailedPrecondition || c == codes.NotFound {
				r.lease.lose(err.Error())
				r.ctx.cancel(ErrLeaseLost)
				return
			}
			failures++ // every node asked failed: again soon, from the next one
			next = time.Now().Add(min(time.Second, every))
			continue
		}
		r.lease.extend(sent.Add(resp.GetLease().AsDuration() - w.SafetyMargin))
		failures, next = 0, sent.Add(every)
	}
}

var errStopped = errors.New("stopped")

type heartbeatAnswer struct {
	resp *pb.HeartbeatResponse
	err  error
}

// heartbeat asks the job's node (or, after failures, the next one) to extend the lease, and
// the next node as well whenever those asked have not answered within half the time left or
// have failed: the first answer wins (a heartbeat applied twice only extends the lease). It
// gives up at the lease's deadline, and returns errStopped when stop closes first.
func (w *Worker) heartbeat(r *run, first int, stop <-chan struct{}) (*pb.HeartbeatResponse, error) {
	targets := w.targets(r.node)
	req := &pb.HeartbeatRequest{
		JobId: r.job.JobID, Fence: r.job.Fence, Lease: durationpb.New(w.Lease),
		Started: true, StartedAt: timestamppb.New(r.job.StartedAt),
	}
	deadline := r.lease.until()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	answers := make(chan heartbeatAnswer, len(targets))
	asked, pending := 0, 0
	var hedge <-chan time.Time
	ask := func() {
		n := targets[(first+asked)%len(targets)]
		asked++
		pending++
		go func() {
			resp, err := n.worker.Heartbeat(ctx, req)
			answers <- heartbeatAnswer{resp, translate(context.Background(), err)}
		}()
		hedge = nil
		if asked < len(targets) {
			hedge = time.After(max(0, time.Until(deadline)) / 2)
		}
	}
	ask()
	var lastErr error = &Error{Code: codes.DeadlineExceeded, Message: "no heartbeat granted before the lease's deadline"}
	for {
		select {
		case <-stop:
			return nil, errStopped
		case <-ctx.Done():
			return nil, lastErr
		case <-hedge:
			ask()
		case a := <-answers:
			pending--
			if a.err == nil {
				return a.resp, nil
			}
			if c := codeOf(a.err); c == codes.FailedPrecondition || c == codes.NotFound {
				return nil, a.err
			}
			lastErr = a.err
			if asked < len(targets) {
				ask()
			} else if pending == 0 {
				return nil, lastErr
			}
		}
	}
}

// shutdown: the claim loops are stopped. Let the running handlers finish for at most
// DrainTimeout, then cancel the rest (ErrShutdown: each gives its job back once its handler
// returned within StopGrace), and wait for every job to be settled.
func (w *Worker) shutdown() {
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(w.DrainTimeout):
	}
	w.mu.Lock()
	for r := range w.running {
		r.ctx.cancel(ErrShutdown)
	}
	w.mu.Unlock()
	<-done
}

func truncateError(text string) string {
	if len(text) <= maxErrorBytes {
		return text
	}
	cut := maxErrorBytes - len(" [truncated]")
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + " [truncated]"
}
