// Package timeshard is the Go client and worker of timeshard, a distributed scheduler for
// delayed and cron jobs.
//
//	c, err := timeshard.NewClient(timeshard.ConfigFromEnv())
//	done, err := c.Schedule(ctx, timeshard.NewJob{Type: "email.send", Payload: body, Delay: time.Hour})
//
// Errors map the gRPC status to sentinels: errors.Is(err, timeshard.ErrNotFound). Client.Wait
// (wait.go) returns a job once it is finished, with the result its handler returned
// (DecodeResult). The worker side is Worker (worker.go).
package timeshard

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The wire types, as generated from proto/timeshard/v1.
type (
	Job         = pb.Job
	JobState    = pb.JobState
	Schedule    = pb.Schedule
	FireTime    = pb.FireTime
	ClusterNode = pb.Node
	TypeInfo    = pb.TypeInfo
)

// Job states.
const (
	StateScheduled = pb.JobState_JOB_STATE_SCHEDULED
	StateRunning   = pb.JobState_JOB_STATE_RUNNING
	StateSucceeded = pb.JobState_JOB_STATE_SUCCEEDED
	StateDead      = pb.JobState_JOB_STATE_DEAD
	StateCancelled = pb.JobState_JOB_STATE_CANCELLED
	// StateExpired: not started by its deadline, so never run.
	StateExpired = pb.JobState_JOB_STATE_EXPIRED
)

// maxBatch is the most jobs one ScheduleJobs call takes (the server's limit is 1000).
const maxBatch = 500

// Client calls the JobService of a cluster. It is safe for concurrent use; set its fields
// before the first call.
type Client struct {
	cfg     Config
	conns   []*grpc.ClientConn
	jobs    []pb.JobServiceClient
	admin   []pb.AdminServiceClient
	Timeout time.Duration // per call when the context has no deadline (default 30 s)
	Retries int           // UNAVAILABLE is retried this often when repeating is safe (default 3)
	// OverloadRetries and OverloadBudget bound how Schedule and ScheduleMany retry a node that
	// refuses due-now jobs while overloaded (RESOURCE_EXHAUSTED, from a node started with
	// --max-ready; nothing was stored, so a retry is always safe): each retry waits what the
	// node's `retry-after-ms` trailing metadata says (1 s if it says nothing; at most 30 s per
	// wait, plus up to a tenth more at random), at most OverloadRetries retries (default 5; 0:
	// none) and OverloadBudget of waiting in all per call (default 60 s), never past the
	// context's deadline. Then the call returns ErrResourceExhausted (an *Error whose
	// RetryAfter is the node's last word).
	OverloadRetries int
	OverloadBudget  time.Duration
}

// The defaults of Client's overload retries, and the bounds of one wait.
const (
	DefaultOverloadRetries = 5
	DefaultOverloadBudget  = 60 * time.Second
	DefaultRetryAfter      = time.Second      // when a refusal names no retry-after-ms
	MaxRetryAfter          = 30 * time.Second // one wait is never longer
)

// NewClient opens channels to cfg's servers (lazily: nothing is dialled until the first call).
func NewClient(cfg Config) (*Client, error) {
	c := &Client{
		cfg: cfg, Timeout: 30 * time.Second, Retries: 3,
		OverloadRetries: DefaultOverloadRetries, OverloadBudget: DefaultOverloadBudget,
	}
	for _, address := range cfg.servers() {
		conn, err := cfg.dial(address)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.conns = append(c.conns, conn)
		c.jobs = append(c.jobs, pb.NewJobServiceClient(conn))
		c.admin = append(c.admin, pb.NewAdminServiceClient(conn))
	}
	return c, nil
}

// Close closes the channels.
func (c *Client) Close() error {
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}

// call runs one RPC on the first server; UNAVAILABLE is retried with backoff, on the next
// server, when repeating the call is safe (idempotent).
func call[T any](ctx context.Context, c *Client, idempotent bool, fn func(context.Context, int) (T, error)) (T, error) {
	var zero T
	if _, ok := ctx.Deadline(); !ok && c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		out, err := fn(ctx, attempt%len(c.conns))
		if err == nil {
			return out, nil
		}
		err = translate(ctx, err)
		if !idempotent || codeOf(err) != codes.Unavailable || attempt >= c.Retries {
			return zero, err
		}
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*time.Second, backoff*2)
	}
}

// NewJob is one job to schedule: due after Delay (zero: now) or at RunAt when RunAt is set.
type NewJob struct {
	Type    string
	Payload []byte
	Delay   time.Duration
	RunAt   time.Time
	// IdempotencyKey: a repeat with the same key returns the same job (Created false); the same
	// key with another body is ErrAlreadyExists.
	IdempotencyKey string
	// MaxAttempts: 0 means the server's default.
	MaxAttempts int32
	// Deadline (when set) or DeadlineIn (after the job is due, when not zero): no attempt
	// starts later; a job not started by then ends expired. Not both.
	Deadline   time.Time
	DeadlineIn time.Duration
	// Priority: 0 (default, lowest) to 9, higher first among the due jobs of its type.
	Priority int32
}

func (j NewJob) request() (*pb.ScheduleJobRequest, error) {
	req := &pb.ScheduleJobRequest{
		Type:           j.Type,
		Payload:        j.Payload,
		IdempotencyKey: j.IdempotencyKey,
		MaxAttempts:    j.MaxAttempts,
		Priority:       j.Priority,
	}
	switch {
	case !j.Deadline.IsZero() && j.DeadlineIn != 0:
		return nil, &Error{Code: codes.InvalidArgument, Message: "job " + j.Type + ": give Deadline or DeadlineIn, not both"}
	case !j.Deadline.IsZero():
		req.DeadlineOf = &pb.ScheduleJobRequest_Deadline{Deadline: timestamppb.New(j.Deadline)}
	case j.DeadlineIn != 0:
		req.DeadlineOf = &pb.ScheduleJobRequest_DeadlineIn{DeadlineIn: durationpb.New(j.DeadlineIn)}
	}
	switch {
	case !j.RunAt.IsZero() && j.Delay != 0:
		return nil, &Error{Code: codes.InvalidArgument, Message: "job " + j.Type + ": give Delay or RunAt, not both"}
	case !j.RunAt.IsZero():
		req.When = &pb.ScheduleJobRequest_RunAt{RunAt: timestamppb.New(j.RunAt)}
	default:
		req.When = &pb.ScheduleJobRequest_Delay{Delay: durationpb.New(j.Delay)}
	}
	return req, nil
}

// Scheduled is what scheduling one job did: the job as stored, and whether this call created
// it (false when an idempotency key named an existing job, returned in whatever state it is).
type Scheduled struct {
	Job     *Job
	Created bool
}

// Schedule creates one job. Without an idempotency key an UNAVAILABLE answer is not retried
// (a blind retry could create a second job). A node refusing due-now jobs while overloaded is
// retried after the time it names, within the client's budget (OverloadRetries,
// OverloadBudget); then the error is ErrResourceExhausted.
func (c *Client) Schedule(ctx context.Context, job NewJob) (Scheduled, error) {
	req, err := job.request()
	if err != nil {
		return Scheduled{}, err
	}
	resp, err := retryOverload(ctx, c, job.IdempotencyKey != "", func(ctx context.Context, i int, opt grpc.CallOption) (*pb.ScheduleJobResponse, error) {
		return c.jobs[i].ScheduleJob(ctx, req, opt)
	})
	if err != nil {
		return Scheduled{}, err
	}
	return Scheduled{Job: resp.GetJob(), Created: resp.GetCreated()}, nil
}

// ScheduleMany creates jobs in batches of 500, each batch all or nothing; the results are in
// order. On an error the jobs of the batches before it are created (their results returned).
// Each batch an overloaded node refuses is retried as Schedule's call is.
func (c *Client) ScheduleMany(ctx context.Context, jobs []NewJob) ([]Scheduled, error) {
	done := make([]Scheduled, 0, len(jobs))
	for start := 0; start < len(jobs); start += maxBatch {
		batch := jobs[start:min(len(jobs), start+maxBatch)]
		req := &pb.ScheduleJobsRequest{}
		keyed := true
		for i, j := range batch {
			r, err := j.request()
			if err != nil {
				return done, fmt.Errorf("job %d: %w", start+i, err)
			}
			req.Jobs = append(req.Jobs, r)
			keyed = keyed && j.IdempotencyKey != ""
		}
		resp, err := retryOverload(ctx, c, keyed, func(ctx context.Context, i int, opt grpc.CallOption) (*pb.ScheduleJobsResponse, error) {
			return c.jobs[i].ScheduleJobs(ctx, req, opt)
		})
		if err != nil {
			return done, err
		}
		for _, r := range resp.GetResults() {
			done = append(done, Scheduled{Job: r.GetJob(), Created: r.GetCreated()})
		}
	}
	return done, nil
}

// Get returns a job with its attempt history.
func (c *Client) Get(ctx context.Context, jobID string) (*Job, error) {
	return call(ctx, c, true, func(ctx context.Context, i int) (*Job, error) {
		return c.jobs[i].GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
	})
}

// ListOptions filter and page a listing; the zero value lists the first page of every job.
type ListOptions struct {
	State     JobState
	Type      string
	PageSize  int32
	PageToken string
}

// List returns one page of jobs and the token of the next ("" after the last).
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Job, string, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ListJobsResponse, error) {
		return c.jobs[i].ListJobs(ctx, &pb.ListJobsRequest{
			State: opts.State, Type: opts.Type, PageSize: opts.PageSize, PageToken: opts.PageToken,
		})
	})
	if err != nil {
		return nil, "", err
	}
	return resp.GetJobs(), resp.GetNextPageToken(), nil
}

// Cancel cancels a scheduled or running job (a running one's worker sees it at its next
// heartbeat). A finished job is ErrFailedPrecondition.
func (c *Client) Cancel(ctx context.Context, jobID string) (*Job, error) {
	return call(ctx, c, true, func(ctx context.Context, i int) (*Job, error) {
		return c.jobs[i].CancelJob(ctx, &pb.CancelJobRequest{JobId: jobID})
	})
}

// Reschedule moves a scheduled job to after delay (runAt zero) or to runAt.
func (c *Client) Reschedule(ctx context.Context, jobID string, delay time.Duration, runAt time.Time) (*Job, error) {
	req := &pb.RescheduleJobRequest{JobId: jobID}
	if !runAt.IsZero() {
		req.When = &pb.RescheduleJobRequest_RunAt{RunAt: timestamppb.New(runAt)}
	} else {
		req.When = &pb.RescheduleJobRequest_Delay{Delay: durationpb.New(delay)}
	}
	return call(ctx, c, true, func(ctx context.Context, i int) (*Job, error) {
		return c.jobs[i].RescheduleJob(ctx, req)
	})
}

// CreateSchedule creates a cron schedule (ScheduleId, Cron, Timezone, Type at least), as a
// revision of it (ScheduleHistory). opts: WithReason.
func (c *Client) CreateSchedule(ctx context.Context, s *Schedule, opts ...ChangeOption) (*Schedule, error) {
	req := &pb.CreateScheduleRequest{Schedule: s, Reason: changeOf(opts).reason}
	return call(ctx, c, false, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].CreateSchedule(ctx, req)
	})
}

// GetSchedule returns one schedule.
func (c *Client) GetSchedule(ctx context.Context, scheduleID string) (*Schedule, error) {
	return call(ctx, c, true, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].GetSchedule(ctx, &pb.GetScheduleRequest{ScheduleId: scheduleID})
	})
}

// ListSchedules returns one page of schedules and the token of the next.
func (c *Client) ListSchedules(ctx context.Context, pageSize int32, pageToken string) ([]*Schedule, string, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ListSchedulesResponse, error) {
		return c.jobs[i].ListSchedules(ctx, &pb.ListSchedulesRequest{PageSize: pageSize, PageToken: pageToken})
	})
	if err != nil {
		return nil, "", err
	}
	return resp.GetSchedules(), resp.GetNextPageToken(), nil
}

// UpdateSchedule replaces a schedule's definition (found by its ScheduleId) as a new revision
// (none when the definition is the same). opts: WithReason.
func (c *Client) UpdateSchedule(ctx context.Context, s *Schedule, opts ...ChangeOption) (*Schedule, error) {
	req := &pb.UpdateScheduleRequest{Schedule: s, Reason: changeOf(opts).reason}
	return call(ctx, c, true, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].UpdateSchedule(ctx, req)
	})
}

// PauseSchedule stops a schedule firing until it is resumed, as a new revision (none when it
// is paused already). opts: WithReason.
func (c *Client) PauseSchedule(ctx context.Context, scheduleID string, opts ...ChangeOption) (*Schedule, error) {
	req := &pb.ScheduleIdRequest{ScheduleId: scheduleID, Reason: changeOf(opts).reason}
	return call(ctx, c, true, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].PauseSchedule(ctx, req)
	})
}

// ResumeSchedule lets a paused schedule fire again, as a new revision (none when it is not
// paused). opts: WithReason.
func (c *Client) ResumeSchedule(ctx context.Context, scheduleID string, opts ...ChangeOption) (*Schedule, error) {
	req := &pb.ScheduleIdRequest{ScheduleId: scheduleID, Reason: changeOf(opts).reason}
	return call(ctx, c, true, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].ResumeSchedule(ctx, req)
	})
}

// DeleteSchedule deletes a schedule, as a new revision, and returns that revision (its
// occurrences already created stay; its history is kept for the ledger retention, then
// purged). opts: WithReason.
func (c *Client) DeleteSchedule(ctx context.Context, scheduleID string, opts ...ChangeOption) (int64, error) {
	req := &pb.ScheduleIdRequest{ScheduleId: scheduleID, Reason: changeOf(opts).reason}
	resp, err := call(ctx, c, false, func(ctx context.Context, i int) (*pb.DeleteScheduleResponse, error) {
		return c.jobs[i].DeleteSchedule(ctx, req)
	})
	if err != nil {
		return 0, err
	}
	return resp.GetRevision(), nil
}

// Preview asks what a cron expression would do.
type Preview struct {
	Cron     string
	Timezone string
	From     time.Time // zero: now
	Count    int32
	DstGap   string // shift | skip | "" (the default rule)
	DstFold  string // first | both | ""
	// Spread (with ScheduleID, from which the offset derives): FireTime.RunsAt says when
	// each occurrence would run.
	Spread     time.Duration
	ScheduleID string
}

// PreviewSchedule returns the next fire times of an expression, in UTC and local time.
func (c *Client) PreviewSchedule(ctx context.Context, p Preview) ([]*FireTime, error) {
	req := &pb.PreviewRequest{Cron: p.Cron, Timezone: p.Timezone, Count: p.Count, DstGap: p.DstGap, DstFold: p.DstFold, ScheduleId: p.ScheduleID}
	if p.Spread != 0 {
		req.Spread = durationpb.New(p.Spread)
	}
	if !p.From.IsZero() {
		req.From = timestamppb.New(p.From)
	}
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.PreviewResponse, error) {
		return c.jobs[i].PreviewSchedule(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetTimes(), nil
}

// DeadLetterQuery filters and pages the dead-letter queue.
type DeadLetterQuery struct {
	Type      string
	Since     time.Time
	PageSize  int32
	PageToken string
}

// DeadLetters returns one page of dead jobs and the token of the next.
func (c *Client) DeadLetters(ctx context.Context, q DeadLetterQuery) ([]*Job, string, error) {
	req := &pb.ListDeadLettersRequest{Type: q.Type, PageSize: q.PageSize, PageToken: q.PageToken}
	if !q.Since.IsZero() {
		req.Since = timestamppb.New(q.Since)
	}
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ListDeadLettersResponse, error) {
		return c.jobs[i].ListDeadLetters(ctx, req)
	})
	if err != nil {
		return nil, "", err
	}
	return resp.GetJobs(), resp.GetNextPageToken(), nil
}

// ReplayDeadLetters schedules dead jobs again: the ones named (at most 1000), or, with no ids,
// up to 1000 dead jobs of jobType (call again until none are left).
func (c *Client) ReplayDeadLetters(ctx context.Context, jobIDs []string, jobType string) ([]*Job, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ReplayDeadLettersResponse, error) {
		return c.jobs[i].ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{JobIds: jobIDs, Type: jobType})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetJobs(), nil
}

// PurgeDeadLetters deletes dead jobs (as ReplayDeadLetters selects them); returns their ids.
func (c *Client) PurgeDeadLetters(ctx context.Context, jobIDs []string, jobType string) ([]string, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.PurgeDeadLettersResponse, error) {
		return c.jobs[i].PurgeDeadLetters(ctx, &pb.ReplayDeadLettersRequest{JobIds: jobIDs, Type: jobType})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetJobIds(), nil
}

// ClusterInfo lists the cluster's nodes.
func (c *Client) ClusterInfo(ctx context.Context) ([]*ClusterNode, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ClusterInfoResponse, error) {
		return c.admin[i].ClusterInfo(ctx, &pb.ClusterInfoRequest{})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetNodes(), nil
}

// SetTypeRate limits how many jobs of jobType start per second across the cluster, with
// burst starting at once (0: half a second's worth); rate 0 removes the limit. It returns the
// type as the node called now applies it. An admin call.
func (c *Client) SetTypeRate(ctx context.Context, jobType string, rate float64, burst int32) (*TypeInfo, error) {
	return c.setFlow(ctx, &pb.TypeFlow{Type: jobType, Rate: &rate, Burst: burst})
}

// PauseType holds every due job of jobType (accepted and stored, handed to no worker) until
// ResumeType. An admin call.
func (c *Client) PauseType(ctx context.Context, jobType string) (*TypeInfo, error) {
	paused := true
	return c.setFlow(ctx, &pb.TypeFlow{Type: jobType, Paused: &paused})
}

// ResumeType lets a paused type's jobs start again, at its rate if it has one. An admin call.
func (c *Client) ResumeType(ctx context.Context, jobType string) (*TypeInfo, error) {
	paused := false
	return c.setFlow(ctx, &pb.TypeFlow{Type: jobType, Paused: &paused})
}

// ListTypes lists the job types with a policy or a flow (jobType "": all of them) as the node
// called applies them, with their due jobs waiting there and why they are held.
func (c *Client) ListTypes(ctx context.Context, jobType string) ([]*TypeInfo, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ListTypesResponse, error) {
		return c.admin[i].ListTypes(ctx, &pb.ListTypesRequest{Type: jobType})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetTypes(), nil
}

func (c *Client) setFlow(ctx context.Context, flow *pb.TypeFlow) (*TypeInfo, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.SetTypeFlowsResponse, error) {
		return c.admin[i].SetTypeFlows(ctx, &pb.SetTypeFlowsRequest{Flows: []*pb.TypeFlow{flow}})
	})
	if err != nil {
		return nil, err
	}
	for _, t := range resp.GetTypes() {
		if t.GetType() == flow.GetType() {
			return t, nil
		}
	}
	return nil, fmt.Errorf("timeshard: the node did not answer for type %q", flow.GetType())
}
