package timeshard

// A fake node for the SDK's own tests of the worker protocol and the client's retries: an
// in-process gRPC server whose Claim, Heartbeat, Finish and ScheduleJob(s) a test scripts.
// (The conformance suite runs against the real server; this one lets a test make a node
// answer late, refuse, or hold an answer, which a real one does only under load.)

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type fakeNode struct {
	pb.UnimplementedWorkerServiceServer
	pb.UnimplementedJobServiceServer

	address string

	mu         sync.Mutex
	claims     []*pb.ClaimRequest
	heartbeats []*pb.HeartbeatRequest
	finished   []*pb.FinishItem
	schedules  int

	// Scripted answers (nil: a long poll that answers no job / a granted heartbeat).
	claim     func(ctx context.Context, n int, req *pb.ClaimRequest) (*pb.ClaimResponse, error)
	heartbeat func(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error)
	schedule  func(ctx context.Context, n int) error

	heartbeatSeen chan *pb.HeartbeatRequest
	finishSeen    chan *pb.FinishItem
}

func startFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{
		address:       lis.Addr().String(),
		heartbeatSeen: make(chan *pb.HeartbeatRequest, 100),
		finishSeen:    make(chan *pb.FinishItem, 100),
	}
	srv := grpc.NewServer()
	pb.RegisterWorkerServiceServer(srv, f)
	pb.RegisterJobServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeNode) config() Config { return Config{Servers: []string{f.address}} }

func (f *fakeNode) Claim(ctx context.Context, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	f.mu.Lock()
	f.claims = append(f.claims, req)
	n := len(f.claims)
	script := f.claim
	f.mu.Unlock()
	if script != nil {
		return script(ctx, n, req)
	}
	return longPoll(ctx, req)
}

// longPoll answers no job after the claim's wait (or when the worker gives up).
func longPoll(ctx context.Context, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	select {
	case <-ctx.Done():
	case <-time.After(req.GetWait().AsDuration()):
	}
	return &pb.ClaimResponse{}, nil
}

func (f *fakeNode) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	f.mu.Lock()
	f.heartbeats = append(f.heartbeats, req)
	script := f.heartbeat
	f.mu.Unlock()
	f.heartbeatSeen <- req
	if script != nil {
		return script(ctx, req)
	}
	return &pb.HeartbeatResponse{Lease: req.GetLease(), LeaseUntil: timestamppb.New(time.Now().Add(req.GetLease().AsDuration()))}, nil
}

func (f *fakeNode) Finish(ctx context.Context, req *pb.FinishRequest) (*pb.FinishResponse, error) {
	resp := &pb.FinishResponse{}
	for _, item := range req.GetItems() {
		f.mu.Lock()
		f.finished = append(f.finished, item)
		f.mu.Unlock()
		f.finishSeen <- item
		state := pb.JobState_JOB_STATE_SUCCEEDED
		if item.GetGiveBack() {
			state = pb.JobState_JOB_STATE_SCHEDULED
		}
		resp.Results = append(resp.Results, &pb.FinishResult{JobId: item.GetJobId(), State: state})
	}
	return resp, nil
}

func (f *fakeNode) ScheduleJob(ctx context.Context, req *pb.ScheduleJobRequest) (*pb.ScheduleJobResponse, error) {
	if err := f.scheduled(ctx); err != nil {
		return nil, err
	}
	return &pb.ScheduleJobResponse{Job: &pb.Job{JobId: "j", Type: req.GetType()}, Created: true}, nil
}

func (f *fakeNode) ScheduleJobs(ctx context.Context, req *pb.ScheduleJobsRequest) (*pb.ScheduleJobsResponse, error) {
	if err := f.scheduled(ctx); err != nil {
		return nil, err
	}
	resp := &pb.ScheduleJobsResponse{}
	for _, j := range req.GetJobs() {
		resp.Results = append(resp.Results, &pb.ScheduleJobResponse{Job: &pb.Job{JobId: "j", Type: j.GetType()}, Created: true})
	}
	return resp, nil
}

func (f *fakeNode) scheduled(ctx context.Context) error {
	f.mu.Lock()
	f.schedules++
	n := f.schedules
	script := f.schedule
	f.mu.Unlock()
	if script != nil {
		return script(ctx, n)
	}
	return nil
}

func (f *fakeNode) scheduleCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.schedules
}

func (f *fakeNode) claimRequests() []*pb.ClaimRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.ClaimRequest(nil), f.claims...)
}

func (f *fakeNode) heartbeatRequests() []*pb.HeartbeatRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.HeartbeatRequest(nil), f.heartbeats...)
}

// claimedJob is a job as a claim hands it out.
func claimedJob(id, jobType string, fence int64, lease time.Duration) *pb.ClaimedJob {
	return &pb.ClaimedJob{
		Job:   &pb.Job{JobId: id, Type: jobType, Attempt: 1, MaxAttempts: 3, RunAt: timestamppb.Now()},
		Fence: fence,
		Lease: durationpb.New(lease),
	}
}

// runFakeWorker runs w until the test ends (or until the stop it returns is called).
func runFakeWorker(t *testing.T, w *Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// receive waits for one value from ch, failing the test after timeout.
func receive[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
		var zero T
		return zero
	}
}
