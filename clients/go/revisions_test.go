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
	back, err := c.RollbackSchedule(ctx, "digest", 1, "9 was wrong")
	if err != nil || back.GetRevision() != 4 || back.GetCron() != "0 8 * * *" || !back.GetPaused() {
		t.Fatalf("rollback: %v %v", back, err)
	}
	made, err := c.GetScheduleRevision(ctx, "digest", 4)
	if err != nil || made.GetChange() != "rollback" || made.GetRolledBackTo() != 1 || made.GetReason() != "9 was wrong" {
		t.Fatalf("the rollback's revision: %v %v", made, err)
	}
	if again, err := c.RollbackSchedule(ctx, "digest", 1, ""); err != nil || again.GetRevision() != 4 {
		t.Fatalf("a rollback repeated makes no revision: %v %v", again, err)
	}

	_, err = c.GetScheduleRevision(ctx, "digest", 99)
	if e := new(timeshard.Error); !errors.Is(err, timeshard.ErrNotFound) || !errors.As(err, &e) || !strings.Contains(e.Message, "1-4") {
		t.Fatalf("a revision never made: %v", err)
	}
	if _, err := c.RollbackSchedule(ctx, "digest", 99, ""); !errors.Is(err, timeshard.ErrNotFound) {
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

	if err := c.DeleteSchedule(ctx, "digest"); err != nil {
		t.Fatal(err)
	}
	kept, _, err := c.ScheduleHistory(ctx, "digest", 0, "")
	if err != nil || len(kept) != 5 || kept[0].GetChange() != "delete" {
		t.Fatalf("a deleted schedule's history: %v %v", kept, err)
	}
	if _, err := c.RollbackSchedule(ctx, "digest", 1, ""); !errors.Is(err, timeshard.ErrFailedPrecondition) {
		t.Fatalf("rollback of a deleted schedule: %v", err)
	}
}
