package timeshard

import (
	"context"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
)

// ScheduleRevision is one revision of a schedule: what a person did (GetChange: create, update,
// pause, resume, delete or rollback), who (GetActor: the caller's token name, "anonymous" on a
// node without tokens), when (GetAt), why (GetReason), and the schedule as it was right after
// (GetSchedule; for a delete, as it was when deleted). A schedule keeps its newest 100 revisions,
// also once deleted (for the ledger retention, then it is purged).
type ScheduleRevision = pb.ScheduleRevision

// ChangeOption adds to a change of a schedule: the last argument of CreateSchedule,
// UpdateSchedule, PauseSchedule, ResumeSchedule and DeleteSchedule. None is needed.
type ChangeOption func(*change)

// change is what the options of one schedule change say.
type change struct {
	reason string
}

// WithReason says why a schedule is changed; the node keeps it with the revision the change
// makes (ScheduleRevision.GetReason). At most 1000 bytes of UTF-8: a longer one is
// ErrInvalidArgument and nothing is changed. A change that changes nothing (a pause of a
// paused schedule, a retry of one that took effect) makes no revision, so its reason is not
// kept. Given twice, the last one counts.
//
//	c.PauseSchedule(ctx, "nightly", timeshard.WithReason("maintenance"))
func WithReason(reason string) ChangeOption {
	return func(ch *change) { ch.reason = reason }
}

// changeOf applies opts (nil ones skipped).
func changeOf(opts []ChangeOption) change {
	var ch change
	for _, opt := range opts {
		if opt != nil {
			opt(&ch)
		}
	}
	return ch
}

// ScheduleHistory returns one page of a schedule's revisions, newest first, and the token of
// the next page ("" on the last). pageSize 0 means 20, at most 100; pageToken "" starts from
// the newest. An unknown schedule is ErrNotFound.
func (c *Client) ScheduleHistory(ctx context.Context, scheduleID string, pageSize int32, pageToken string) ([]*ScheduleRevision, string, error) {
	resp, err := call(ctx, c, true, func(ctx context.Context, i int) (*pb.ListScheduleRevisionsResponse, error) {
		req := &pb.ListScheduleRevisionsRequest{ScheduleId: scheduleID, PageSize: pageSize, PageToken: pageToken}
		return c.jobs[i].ListScheduleRevisions(ctx, req)
	})
	if err != nil {
		return nil, "", err
	}
	return resp.GetRevisions(), resp.GetNextPageToken(), nil
}

// GetScheduleRevision returns revision n of a schedule. One not kept (never made, or older than
// the newest 100) is ErrNotFound, its message naming the revisions kept.
func (c *Client) GetScheduleRevision(ctx context.Context, scheduleID string, n int64) (*ScheduleRevision, error) {
	return call(ctx, c, true, func(ctx context.Context, i int) (*ScheduleRevision, error) {
		return c.jobs[i].GetScheduleRevision(ctx, &pb.GetScheduleRevisionRequest{ScheduleId: scheduleID, Revision: n})
	})
}

// RollbackSchedule makes a new revision whose definition (cron, time zone, DST rules, job
// template, policies) is revision n's; the schedule stays paused or running as it is. It
// returns the schedule (GetRevision: the revision made; the current one when the schedule
// has that definition already, so a retry changes nothing). opts: WithReason, kept with the
// revision as on the other changes. A revision not kept is ErrNotFound; a deleted schedule
// ErrFailedPrecondition (nothing changed either way).
func (c *Client) RollbackSchedule(ctx context.Context, scheduleID string, n int64, opts ...ChangeOption) (*Schedule, error) {
	req := &pb.RollbackScheduleRequest{ScheduleId: scheduleID, Revision: n, Reason: changeOf(opts).reason}
	return call(ctx, c, true, func(ctx context.Context, i int) (*Schedule, error) {
		return c.jobs[i].RollbackSchedule(ctx, req)
	})
}
