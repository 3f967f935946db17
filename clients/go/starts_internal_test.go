package timeshard

// Start notices and jobs given back unstarted (docs/architecture.md, "When an attempt counts"),
// against a fake node that can answer late and hold its answers.

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
)

func fakeWorker(f *fakeNode, lease, margin time.Duration) *Worker {
	w := NewWorker(f.config())
	w.Lease, w.SafetyMargin = lease, margin
	w.ClaimWait = 500 * time.Millisecond
	w.DiscoverEvery = -1
	w.DrainTimeout = time.Second
	return w
}

// The worker sends a start notice as it starts a handler: a heartbeat with started and
// started_at, at once, without the handler waiting for its answer. Every later heartbeat of
// that handler says started too.
func TestTheStartNoticeGoesAtOnceAndDoesNotHoldTheHandler(t *testing.T) {
	f := startFakeNode(t)
	release := make(chan struct{}) // the node holds its heartbeat answers until then
	f.claim = func(ctx context.Context, n int, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
		if n == 1 {
			return &pb.ClaimResponse{Jobs: []*pb.ClaimedJob{claimedJob("j1", "t", 7, 3*time.Second)}}, nil
		}
		return longPoll(ctx, req)
	}
	f.heartbeat = func(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &pb.HeartbeatResponse{Lease: req.GetLease()}, nil
	}
	w := fakeWorker(f, 3*time.Second, 300*time.Millisecond)
	started := make(chan *JobContext, 1)
	finish := make(chan struct{})
	w.Handle("t", HandlerOptions{}, func(ctx context.Context, job *JobContext) error {
		started <- job
		select {
		case <-finish:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	runFakeWorker(t, w)

	job := receive(t, started, 5*time.Second, "the handler to start while its notice is unanswered")
	notice := receive(t, f.heartbeatSeen, 5*time.Second, "the start notice")
	if notice.GetJobId() != "j1" || notice.GetFence() != 7 || !notice.GetStarted() {
		t.Fatalf("the first heartbeat is not a start notice: %v", notice)
	}
	if got := notice.GetStartedAt().AsTime(); got.Sub(job.StartedAt).Abs() > time.Millisecond {
		t.Fatalf("started_at %s, the handler started at %s", got, job.StartedAt)
	}
	if sent := time.Since(job.StartedAt); sent > w.Lease/3 {
		t.Fatalf("the notice came %s after the start, not at once", sent)
	}
	close(release)
	next := receive(t, f.heartbeatSeen, 5*time.Second, "the next heartbeat")
	if !next.GetStarted() || !next.GetStartedAt().AsTime().Equal(notice.GetStartedAt().AsTime()) {
		t.Fatalf("a later heartbeat of the running handler: %v", next)
	}
	close(finish)
	item := receive(t, f.finishSeen, 5*time.Second, "the result")
	if item.GetJobId() != "j1" || item.GetFailed() || item.GetNotStarted() {
		t.Fatalf("result: %v", item)
	}
}

// A claim whose answer is read after the job's deadline ((claim sent) + lease - margin) is
// given back at once, unstarted (give_back, not_started, failed for older nodes), fenced; its
// handler never runs and its slot is free again for the next claim.
func TestALateClaimAnswerIsGivenBackUnstarted(t *testing.T) {
	f := startFakeNode(t)
	const lease, margin = 2 * time.Second, 300 * time.Millisecond
	f.claim = func(ctx context.Context, n int, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
		if n == 1 {
			time.Sleep(lease) // the answer arrives when the lease is over
			return &pb.ClaimResponse{Jobs: []*pb.ClaimedJob{claimedJob("late", "t", 11, lease)}}, nil
		}
		return longPoll(ctx, req)
	}
	w := fakeWorker(f, lease, margin)
	var mu sync.Mutex
	var events []string
	w.OnEvent = func(kind string, job *JobContext, detail string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, kind+": "+job.JobID+": "+detail)
	}
	ran := make(chan struct{}, 1)
	w.Handle("t", HandlerOptions{Concurrency: 1}, func(ctx context.Context, job *JobContext) error {
		ran <- struct{}{}
		return nil
	})
	stop := runFakeWorker(t, w)

	item := receive(t, f.finishSeen, 10*time.Second, "the give-back")
	if item.GetJobId() != "late" || item.GetFence() != 11 || !item.GetFailed() || !item.GetGiveBack() ||
		!item.GetNotStarted() || item.GetError() != whyLate {
		t.Fatalf("give-back item: %v", item)
	}
	// The slot is free: the next claim asks for it.
	deadline := time.Now().Add(5 * time.Second)
	for len(f.claimRequests()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no claim after the give-back: the slot was not freed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.claimRequests()[1].GetMaxJobs(); got != 1 {
		t.Fatalf("the next claim asks for %d jobs, want 1", got)
	}
	stop()
	select {
	case <-ran:
		t.Fatal("the handler of a job given back ran")
	default:
	}
	if hb := f.heartbeatRequests(); len(hb) != 0 {
		t.Fatalf("heartbeats for a job not started: %v", hb)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0] != EventNotStarted+": late: "+whyLate {
		t.Fatalf("events: %q", events)
	}
}

// Why a claimed job is not started: the worker stopping, no handler for its type, its deadline
// passed, or less than the safety margin left before it.
func TestWhyAClaimedJobIsNotStarted(t *testing.T) {
	w := &Worker{SafetyMargin: time.Second}
	spec := &handlerSpec{jobType: "t"}
	live := context.Background()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	now := time.Now()
	for _, c := range []struct {
		name     string
		ctx      context.Context
		jobType  string
		deadline time.Time
		want     string
	}{
		{"time to run", live, "t", now.Add(time.Minute), ""},
		{"just the margin left", live, "t", now.Add(1100 * time.Millisecond), ""},
		{"less than the margin left", live, "t", now.Add(500 * time.Millisecond), whyTooClose},
		{"deadline passed", live, "t", now.Add(-time.Millisecond), whyLate},
		{"stopping", stopped, "t", now.Add(time.Minute), whyStopping},
		{"another type", live, "u", now.Add(time.Minute), `not started: the worker has no handler for type "u"`},
	} {
		if got := w.whyNotStart(c.ctx, spec, &JobContext{Type: c.jobType}, c.deadline); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// A claim answered while the worker stops is not started but given back, so a deploy neither
// runs a new handler after the stop nor leaves the job to its lease.
func TestAJobClaimedWhileStoppingIsGivenBack(t *testing.T) {
	f := startFakeNode(t)
	w := fakeWorker(f, 10*time.Second, time.Second)
	w.Handle("t", HandlerOptions{}, func(ctx context.Context, job *JobContext) error {
		t.Error("a handler started after the stop")
		return nil
	})
	if err := w.defaults(); err != nil {
		t.Fatal(err)
	}
	w.running = map[*run]struct{}{}
	n, err := newNode(w.cfg, f.address)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	w.nodes, w.order = map[string]*node{f.address: n}, []string{f.address}
	spec := w.handlers["t"]
	spec.slots.reserve()
	spec.slots.claimed(1, 1)
	stopping, cancel := context.WithCancel(context.Background())
	cancel()
	w.start(stopping, n, spec, claimedJob("s", "t", 3, 10*time.Second), time.Now())
	w.wg.Wait()
	item := receive(t, f.finishSeen, 5*time.Second, "the give-back")
	if item.GetJobId() != "s" || item.GetFence() != 3 || !item.GetNotStarted() || !item.GetGiveBack() || item.GetError() != whyStopping {
		t.Fatalf("give-back item: %v", item)
	}
	if spec.slots.running() != 0 {
		t.Fatalf("%d slots held after the give-back", spec.slots.running())
	}
}

// A margin of half the lease or more would leave no job time to start: refused up front.
func TestASafetyMarginOfHalfTheLeaseIsRefused(t *testing.T) {
	w := NewWorker(Config{})
	w.Handle("t", HandlerOptions{}, func(ctx context.Context, job *JobContext) error { return nil })
	w.Lease, w.SafetyMargin = 2*time.Second, time.Second
	if err := w.defaults(); err == nil {
		t.Fatal("a margin of half the lease was taken")
	}
	w.SafetyMargin = 900 * time.Millisecond
	if err := w.defaults(); err != nil {
		t.Fatal(err)
	}
	// A claim answered at the end of its long poll still leaves the margin before its deadline.
	if left := w.Lease - w.SafetyMargin - w.pollWait(); left < w.SafetyMargin {
		t.Fatalf("poll wait %s leaves %s, less than the margin %s", w.pollWait(), left, w.SafetyMargin)
	}
}
