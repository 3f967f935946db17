package timeshard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

// The revision calls against a real node: the history a page at a time, one revision, a
// rollback as a new revision; a revision or schedule that does not exist is ErrNotFound, a
// rollback of a deleted schedule ErrFailedPrecondition, and neither changes anything.
func TestScheduleRevisions(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	ctx := context.Background()
	def := func(cron string) *timeshard.Schedule {
		return &timeshard.Schedule{ScheduleId: "digest", Cron: cron, Timezone: "UTC", Type: "rev.a"}
	}
	if _, err := c.CreateSchedule(ctx, def("0 8 * * *")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateSchedule(ctx, def("0 9 * * *")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PauseSchedule(ctx, "digest"); err != nil {
		t.Fatal(err)
	}
	page, next, err := c.ScheduleHistory(ctx, "digest", 2, "")
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("first page: %v %q %v", page, next, err)
	}
	if page[0].GetRevision() != 3 || page[0].GetChange() != "pause" || page[1].GetChange() != "update" {
		t.Fatalf("newest first: %v", page)
	}
	if page[1].GetActor() != "anonymous" || page[1].GetSchedule().GetCron() != "0 9 * * *" || page[1].GetAt() == nil {
		t.Fatalf("who, what and when: %v", page[1])
	}
	rest, last, err := c.ScheduleHistory(ctx, "digest", 2, next)
	if err != nil || len(rest) != 1 || rest[0].GetRevision() != 1 || last != "" {
		t.Fatalf("last page: %v %q %v", rest, last, err)
	}
	first, err := c.GetScheduleRevision(ctx, "digest", 1)
	if err != nil || first.GetChange() != "create" || first.GetSchedule().GetCron() != "0 8 * * *" {
		t.Fatalf("revision 1: %v %v", first, err)
	}
	back, err := c.RollbackSchedule(ctx, "digest", 1, timeshard.WithReason("9 was wrong"))
	if err != nil || back.GetRevision() != 4 || back.GetCron() != "0 8 * * *" || !back.GetPaused() {
		t.Fatalf("rollback: %v %v", back, err)
	}
	made, err := c.GetScheduleRevision(ctx, "digest", 4)
	if err != nil || made.GetChange() != "rollback" || made.GetRolledBackTo() != 1 || made.GetReason() != "9 was wrong" {
		t.Fatalf("the rollback's revision: %v %v", made, err)
	}
	if again, err := c.RollbackSchedule(ctx, "digest", 1); err != nil || again.GetRevision() != 4 {
		t.Fatalf("a rollback repeated makes no revision: %v %v", again, err)
	}

	_, err = c.GetScheduleRevision(ctx, "digest", 99)
	if e := new(timeshard.Error); !errors.Is(err, timeshard.ErrNotFound) || !errors.As(err, &e) || !strings.Contains(e.Message, "1-4") {
		t.Fatalf("a revision never made: %v", err)
	}
	if _, err := c.RollbackSchedule(ctx, "digest", 99); !errors.Is(err, timeshard.ErrNotFound) {
		t.Fatalf("rollback to a revision never made: %v", err)
	}
	if _, _, err := c.ScheduleHistory(ctx, "ghost", 0, ""); !errors.Is(err, timeshard.ErrNotFound) {
		t.Fatalf("history of an unknown schedule: %v", err)
	}
	if _, _, err := c.ScheduleHistory(ctx, "digest", 101, ""); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("a page over 100: %v", err)
	}
	if now, err := c.GetSchedule(ctx, "digest"); err != nil || now.GetRevision() != 4 {
		t.Fatalf("refused calls changed the schedule: %v %v", now, err)
	}

	if rev, err := c.DeleteSchedule(ctx, "digest"); err != nil || rev != 5 {
		t.Fatalf("delete: revision %d, %v", rev, err)
	}
	kept, _, err := c.ScheduleHistory(ctx, "digest", 0, "")
	if err != nil || len(kept) != 5 || kept[0].GetChange() != "delete" {
		t.Fatalf("a deleted schedule's history: %v %v", kept, err)
	}
	if _, err := c.RollbackSchedule(ctx, "digest", 1); !errors.Is(err, timeshard.ErrFailedPrecondition) {
		t.Fatalf("rollback of a deleted schedule: %v", err)
	}
}

// A reason given with WithReason reaches the node and is kept with the revision each change
// makes: create, update, pause, resume and delete. Without one the revision's reason is "". A
// reason over 1000 bytes (counted in UTF-8, not characters) is ErrInvalidArgument and changes
// nothing.
func TestScheduleChangeReasons(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	ctx := context.Background()
	def := func(cron string) *timeshard.Schedule {
		return &timeshard.Schedule{ScheduleId: "backup", Cron: cron, Timezone: "UTC", Type: "rev.b"}
	}
	newest := func() *timeshard.ScheduleRevision {
		t.Helper()
		page, _, err := c.ScheduleHistory(ctx, "backup", 1, "")
		if err != nil || len(page) != 1 {
			t.Fatalf("history: %v %v", page, err)
		}
		return page[0]
	}

	if _, err := c.CreateSchedule(ctx, def("0 1 * * *"), timeshard.WithReason("new backups")); err != nil {
		t.Fatal(err)
	}
	if r := newest(); r.GetChange() != "create" || r.GetReason() != "new backups" {
		t.Fatalf("create: %v", r)
	}
	if _, err := c.UpdateSchedule(ctx, def("0 2 * * *"), timeshard.WithReason("after the batch")); err != nil {
		t.Fatal(err)
	}
	if r := newest(); r.GetChange() != "update" || r.GetReason() != "after the batch" {
		t.Fatalf("update: %v", r)
	}
	if p, err := c.PauseSchedule(ctx, "backup", timeshard.WithReason("maintenance")); err != nil || !p.GetPaused() || p.GetRevision() != 3 {
		t.Fatalf("pause: %v %v", p, err)
	}
	if r := newest(); r.GetRevision() != 3 || r.GetChange() != "pause" || r.GetReason() != "maintenance" {
		t.Fatalf("pause: %v", r)
	}

	// Refused before anything is written: 1001 bytes, and 501 two-byte characters (1002 bytes).
	for _, long := range []string{strings.Repeat("x", 1001), strings.Repeat("é", 501)} {
		_, err := c.ResumeSchedule(ctx, "backup", timeshard.WithReason(long))
		if !errors.Is(err, timeshard.ErrInvalidArgument) {
			t.Fatalf("a reason of %d bytes: %v", len(long), err)
		}
	}
	if now, err := c.GetSchedule(ctx, "backup"); err != nil || now.GetRevision() != 3 || !now.GetPaused() {
		t.Fatalf("a refused reason changed the schedule: %v %v", now, err)
	}

	full := strings.Repeat("é", 500) // 1000 bytes: the limit itself
	if r, err := c.ResumeSchedule(ctx, "backup", timeshard.WithReason(full)); err != nil || r.GetPaused() {
		t.Fatalf("resume with a reason of 1000 bytes: %v %v", r, err)
	}
	if r := newest(); r.GetChange() != "resume" || r.GetReason() != full {
		t.Fatalf("resume: %v", r)
	}
	if _, err := c.PauseSchedule(ctx, "backup"); err != nil {
		t.Fatal(err)
	}
	if r := newest(); r.GetChange() != "pause" || r.GetReason() != "" {
		t.Fatalf("a pause without a reason: %v", r)
	}
	// Given twice, the last reason counts.
	if _, err := c.DeleteSchedule(ctx, "backup", timeshard.WithReason("old"), timeshard.WithReason("moved to cold storage")); err != nil {
		t.Fatal(err)
	}
	if r := newest(); r.GetRevision() != 6 || r.GetChange() != "delete" || r.GetReason() != "moved to cold storage" {
		t.Fatalf("delete: %v", r)
	}
}
