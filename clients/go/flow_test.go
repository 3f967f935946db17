package timeshard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

// A paused type keeps its due jobs stored and held; a resume lets them run. A rate is set and
// read back; a bad one is refused with ErrInvalidArgument.
func TestPauseResumeAndRateOfAType(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	if info, err := c.PauseType(bg, "flow.t"); err != nil || !info.GetPaused() {
		t.Fatalf("pause: %v %v", info, err)
	}
	w := newWorker(s.config())
	w.Handle("flow.t", timeshard.HandlerOptions{Concurrency: 2}, func(ctx context.Context, job *timeshard.JobContext) error {
		return nil
	})
	runWorker(t, w)
	done, err := c.Schedule(bg, timeshard.NewJob{Type: "flow.t", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the job held as paused", func() bool {
		types, err := c.ListTypes(bg, "flow.t")
		return err == nil && len(types) == 1 && types[0].GetHeld() == "paused" && types[0].GetReady() == 1
	})
	if job, err := c.Get(bg, done.Job.GetJobId()); err != nil || job.GetState() != timeshard.StateScheduled {
		t.Fatalf("a paused type's job ran: %v %v", job, err)
	}
	if info, err := c.ResumeType(bg, "flow.t"); err != nil || info.GetPaused() {
		t.Fatalf("resume: %v %v", info, err)
	}
	waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second)

	if info, err := c.SetTypeRate(bg, "flow.t", 20, 5); err != nil || info.GetRate() != 20 || info.GetBurst() != 5 {
		t.Fatalf("rate: %v %v", info, err)
	}
	if _, err := c.SetTypeRate(bg, "flow.t", -1, 0); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("a negative rate: %v", err)
	}
	if info, err := c.SetTypeRate(bg, "flow.t", 0, 0); err != nil || info.GetRate() != 0 {
		t.Fatalf("no limit: %v %v", info, err)
	}
}
