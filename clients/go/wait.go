package timeshard

// Waiting for jobs to finish, over the server-streaming JobService.WaitJobs, as the Python
// client's wait, wait_many and as_finished do. (A file of its own: the Client's unary calls are
// client.go; this is the one call that streams and loops.)

import (
	"context"
	"errors"
	"io"
	"iter"
	"slices"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// maxWait is the longest one WaitJobs call waits (the server's cap, 600 s): a longer wait is
// made of several calls.
const maxWait = 600 * time.Second

// maxWaitIDs is the most jobs one WaitJobs call names (the server's limit).
const maxWaitIDs = 1000

// Wait returns the job once it is finished: succeeded, dead, cancelled or expired (its result,
// if its handler returned one, in job.GetResult(); see DecodeResult). After timeout it returns
// a *WaitTimeoutError (errors.Is(err, ErrDeadlineExceeded)); timeout 0 or less sets no limit of
// its own, and ctx bounds the wait. An unknown id is ErrNotFound.
func (c *Client) Wait(ctx context.Context, jobID string, timeout time.Duration) (*Job, error) {
	done, err := c.WaitMany(ctx, []string{jobID}, timeout)
	if err != nil {
		return nil, err
	}
	return done[jobID], nil
}

// WaitMany returns every job of jobIDs once it is finished, by id (see Wait). On an error it
// returns the jobs that finished before it with the error: after timeout, a *WaitTimeoutError
// naming the others.
func (c *Client) WaitMany(ctx context.Context, jobIDs []string, timeout time.Duration) (map[string]*Job, error) {
	done := make(map[string]*Job, len(jobIDs))
	for job, err := range c.AsFinished(ctx, jobIDs, timeout) {
		if err != nil {
			return done, err
		}
		done[job.GetJobId()] = job
	}
	return done, nil
}

// AsFinished yields each job of jobIDs (a repeated id once) as soon as it is finished, in the
// order they finish. The server streams them (WaitJobs): nothing is polled from here, and a
// wait longer than the server's cap of 600 s is made of several calls. The sequence ends after
// the last job, or with one error: a *WaitTimeoutError once timeout has passed (timeout 0 or
// less: no limit of its own), ErrNotFound naming an unknown id, ctx's error. UNAVAILABLE is
// retried (Client.Retries times in a row) on the next server.
//
//	for job, err := range client.AsFinished(ctx, ids, time.Minute) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(job.GetJobId(), job.GetState())
//	}
func (c *Client) AsFinished(ctx context.Context, jobIDs []string, timeout time.Duration) iter.Seq2[*Job, error] {
	return func(yield func(*Job, error) bool) {
		w := newWaiting(jobIDs, timeout)
		server, unavailable := 0, 0
		for len(w.pending) > 0 {
			err := c.waitOnce(ctx, server, w, func(job *Job) bool {
				unavailable = 0
				return yield(job, nil)
			})
			if errors.Is(err, errWaitStopped) {
				return
			}
			if err != nil && ctx.Err() != nil {
				// The caller's context ended (its deadline may fire a hair after the call's,
				// which is derived from it): its error, not the call's status.
				yield(nil, ctx.Err())
				return
			}
			if err != nil {
				switch code := codeOf(err); {
				case code == codes.Unavailable && unavailable < c.Retries && ctx.Err() == nil:
					unavailable++
					server = (server + 1) % len(c.jobs)
					if !sleepCtx(ctx, min(2*time.Second, 100*time.Millisecond<<unavailable)) {
						yield(nil, ctx.Err())
						return
					}
				case code == codes.DeadlineExceeded && ctx.Err() == nil:
					// The call's own time (the server's cap, or our timeout) passed: ask again
					// for the rest, unless our timeout is over (below).
				default:
					yield(nil, err)
					return
				}
			}
			if timedOut := w.timedOut(); timedOut != nil {
				yield(nil, timedOut)
				return
			}
		}
	}
}

// errWaitStopped: the consumer of AsFinished stopped taking jobs.
var errWaitStopped = errors.New("the wait was stopped")

// waitOnce makes one WaitJobs call on server for the jobs still pending, handing each job it
// streams to got; errWaitStopped when got says stop.
func (c *Client) waitOnce(ctx context.Context, server int, w *waiting, got func(*Job) bool) error {
	wait := w.next()
	callCtx, cancel := context.WithTimeout(ctx, wait+c.Timeout)
	defer cancel()
	stream, err := c.jobs[server].WaitJobs(callCtx, &pb.WaitJobsRequest{
		JobIds:  slices.Clone(w.pending[:min(len(w.pending), maxWaitIDs)]),
		Timeout: durationpb.New(wait),
	})
	if err != nil {
		return translate(ctx, err)
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return translate(ctx, err)
		}
		job := resp.GetJob()
		w.finished(job.GetJobId())
		if !got(job) {
			return errWaitStopped
		}
	}
}

// waiting is what a wait for jobs has still to hear of.
type waiting struct {
	pending  []string
	timeout  time.Duration
	deadline time.Time // zero: no timeout of its own
}

func newWaiting(jobIDs []string, timeout time.Duration) *waiting {
	w := &waiting{timeout: timeout}
	seen := make(map[string]bool, len(jobIDs))
	for _, id := range jobIDs {
		if !seen[id] {
			seen[id] = true
			w.pending = append(w.pending, id)
		}
	}
	if timeout > 0 {
		w.deadline = time.Now().Add(timeout)
	}
	return w
}

// next is how long the next call waits: what is left of the timeout, at most the server's cap.
func (w *waiting) next() time.Duration {
	if w.deadline.IsZero() {
		return maxWait
	}
	return max(0, min(maxWait, time.Until(w.deadline)))
}

func (w *waiting) finished(jobID string) {
	for i, id := range w.pending {
		if id == jobID {
			w.pending = append(w.pending[:i], w.pending[i+1:]...)
			return
		}
	}
}

// timedOut is the error of a wait whose timeout passed with jobs pending, else nil.
func (w *waiting) timedOut() error {
	if len(w.pending) == 0 || w.deadline.IsZero() || time.Now().Before(w.deadline) {
		return nil
	}
	return &WaitTimeoutError{Pending: append([]string(nil), w.pending...), Timeout: w.timeout}
}

// sleepCtx sleeps for d, or less when ctx is done first (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
