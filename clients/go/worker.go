package timeshard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Handler runs one job. Return nil for success, Permanent(err) to send the job to the
// dead-letter queue, any other error to have it retried with its type's backoff. The context is
// cancelled when the job is no longer this worker's (its lease could not be extended in time,
// the job was cancelled or claimed by another worker), when the type's timeout passes, and when
// the worker shuts down: stop then, and write nothing more. A handler that ignores its context
// keeps its slot until it returns.
type Handler func(ctx context.Context, job *JobContext) error

// ResultHandler runs one job, as a Handler does, and returns its result: what a client reads
// back from the finished job (Client.Wait, then DecodeResult or job.GetResult()). nil is no
// result; a []byte is stored as it is (ResultEncoding "bytes"); any other value as compact JSON
// ("json"; a json.RawMessage is JSON already). The value is used only when the error is nil. A
// value that can not be stored — json.Marshal refuses it, or it is over MaxResultBytes — fails
// the attempt permanently (dead letter) with a message saying why: the handler's effects have
// happened, and a retry would only repeat them for the same value.
type ResultHandler func(ctx context.Context, job *JobContext) (any, error)

// HandlerOptions are a job type's limits in this worker.
type HandlerOptions struct {
	// Concurrency is the most handlers of the type running at once in this worker, across every
	// node it polls (default 1).
	Concurrency int
	// Timeout is how long a handler may run (default 5 minutes): then its context is cancelled
	// and the attempt fails (retried).
	Timeout time.Duration
}

// Event kinds passed to Worker.OnEvent.
const (
	EventStarted   = "started"
	EventSucceeded = "succeeded"
	EventFailed    = "failed"
	EventDead      = "dead"
	EventLost      = "lost"       // the lease was lost or not extended in time: nothing reported
	EventGivenBack = "given back" // the worker shut down and gave the job back
	// EventNotStarted: a claimed job this worker did not start (its lease was over, or too
	// short to run, when the claim's answer was read; the worker was stopping) was given back
	// unstarted, its attempt not counted. The detail says why, and whether the node took it.
	EventNotStarted = "not started"
)

type handlerSpec struct {
	fn      ResultHandler
	opts    HandlerOptions
	slots   *slots
	jobType string
}

// Worker claims jobs from every node of a cluster and runs their handlers, following the
// worker protocol of docs/architecture.md (unary calls: ClusterInfo, Claim, Heartbeat,
// Finish). Set its fields before Run.
type Worker struct {
	// ID names this worker in leases and attempt histories (default host-pid-random).
	ID string
	// Lease asked for each job (default 30 s); heartbeats extend it every third of it.
	Lease time.Duration
	// SafetyMargin: a handler whose lease was not extended is cancelled this long before the
	// lease ends, on this process's monotonic clock (default Lease/6, less than Lease/2). A job
	// whose claim answer leaves less than this margin before that deadline is not started but
	// given back (EventNotStarted).
	SafetyMargin time.Duration
	// ClaimWait is the longest a claim long-polls (default 20 s; at most half of what a lease
	// leaves after its margin).
	ClaimWait time.Duration
	// DiscoverEvery is how often the nodes are asked for the cluster's members (default 5 s;
	// negative: never, only Config.Servers are polled).
	DiscoverEvery time.Duration
	// DrainTimeout is how long Run lets running handlers finish once its context is done
	// (default 30 s); the rest are stopped and given back.
	DrainTimeout time.Duration
	// OnEvent, when set, is told each job's start and end (kind is one of the Event constants).
	OnEvent func(kind string, job *JobContext, detail string)
	// Logger (default slog.Default()).
	Logger *slog.Logger

	cfg      Config
	handlers map[string]*handlerSpec

	mu      sync.Mutex
	nodes   map[string]*node // address -> node
	order   []string         // addresses in the order learned
	running map[*run]struct{}
	loops   sync.WaitGroup // claim loops
	wg      sync.WaitGroup // job goroutines (handlers, and give-backs of jobs not started)
}

// StopGrace is how long a stopped handler (at shutdown) has to return before its job is left
// to its lease instead of being given back.
const StopGrace = 2 * time.Second

// NewWorker makes a worker for the cluster cfg names (cfg.Servers are the seeds).
func NewWorker(cfg Config) *Worker {
	return &Worker{cfg: cfg, handlers: map[string]*handlerSpec{}}
}

// Handle registers the handler of a job type; its jobs end with no result (HandleResult
// registers one that returns one). Call it before Run.
func (w *Worker) Handle(jobType string, opts HandlerOptions, fn Handler) {
	w.HandleResult(jobType, opts, func(ctx context.Context, job *JobContext) (any, error) {
		return nil, fn(ctx, job)
	})
}

// HandleResult registers the handler of a job type whose return value is the job's result
// (see ResultHandler). Call it before Run.
//
// The result is the handler's return value, as it is in the Python SDK, rather than something
// set on the JobContext: the compiler then makes every path of the handler say what it
// returns, the value is taken exactly when the handler ends (nothing a goroutine sets later
// can be lost or race the report), and a failed attempt can not carry one. Handle keeps the
// signature handlers without a result already use.
//
//	w.HandleResult("report.build", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) (any, error) {
//		url, err := build(ctx, job.Payload)
//		if err != nil {
//			return nil, err
//		}
//		return map[string]string{"url": url}, nil // stored as {"url":"..."}
//	})
func (w *Worker) HandleResult(jobType string, opts HandlerOptions, fn ResultHandler) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	w.handlers[jobType] = &handlerSpec{fn: fn, opts: opts, slots: newSlots(opts.Concurrency), jobType: jobType}
}

// MaxRunning is the most handlers of jobType that ran at once in this worker so far.
func (w *Worker) MaxRunning(jobType string) int {
	spec := w.handlers[jobType]
	spec.slots.mu.Lock()
	defer spec.slots.mu.Unlock()
	return spec.slots.maxRun
}

func (w *Worker) defaults() error {
	if len(w.handlers) == 0 {
		return errors.New("timeshard: register at least one handler before running the worker")
	}
	if w.ID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		w.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if w.Lease <= 0 {
		w.Lease = 30 * time.Second
	}
	if w.SafetyMargin <= 0 {
		w.SafetyMargin = w.Lease / 6
	}
	if 2*w.SafetyMargin >= w.Lease {
		// A job received with less than the margin before its deadline (lease - margin) is
		// given back unstarted: with a margin of half the lease or more none could ever run.
		return errors.New("timeshard: need 0 < SafetyMargin < Lease/2")
	}
	if w.ClaimWait <= 0 {
		w.ClaimWait = 20 * time.Second
	}
	if w.DiscoverEvery == 0 {
		w.DiscoverEvery = 5 * time.Second
	}
	if w.DrainTimeout <= 0 {
		w.DrainTimeout = 30 * time.Second
	}
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	return nil
}

// pollWait: a long poll waits at most half of what a lease leaves after its margin, so a claim
// taken at the end of the wait still has time left, counted from when it was sent; and no more
// than leaves the margin before the deadline, or the job would be given back as too close to
// run (whyNotStart). (Above a third of the lease the margin is what bounds the wait.)
func (w *Worker) pollWait() time.Duration {
	wait := min(w.ClaimWait, (w.Lease-w.SafetyMargin)/2, w.Lease-2*w.SafetyMargin)
	return max(wait, 100*time.Millisecond)
}

// Run claims and runs jobs until ctx is done, then shuts down: it stops claiming, lets the
// running handlers finish for at most DrainTimeout, cancels the rest, and gives back each job
// whose handler returned within StopGrace (a handler still running is left to its lease).
// It returns nil after a shutdown, or an error when the worker could not start.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.defaults(); err != nil {
		return err
	}
	if _, err := w.cfg.transport(); err != nil {
		return err
	}
	w.nodes = map[string]*node{}
	w.running = map[*run]struct{}{}
	claimCtx, stopClaiming := context.WithCancel(context.Background())
	defer stopClaiming()
	for _, address := range w.cfg.servers() {
		if err := w.addNode(claimCtx, address); err != nil {
			return err
		}
	}
	discovered := make(chan struct{})
	go func() {
		defer close(discovered)
		if w.DiscoverEvery > 0 {
			w.discover(claimCtx)
		}
	}()
	<-ctx.Done()
	stopClaiming()
	<-discovered
	w.loops.Wait() // no job is taken on from here: every one the shutdown must wait for is known
	w.shutdown()
	w.mu.Lock()
	for _, n := range w.nodes {
		n.close()
	}
	w.mu.Unlock()
	return nil
}

// discover asks the known nodes for the cluster's members every DiscoverEvery and starts
// claiming from each node not polled yet. (A node that left is kept: its claims fail and back
// off, and it is polled again when it comes back.)
func (w *Worker) discover(ctx context.Context) {
	for {
		w.discoverOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.DiscoverEvery):
		}
	}
}

func (w *Worker) discoverOnce(ctx context.Context) {
	for _, n := range w.knownNodes() {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := n.admin.ClusterInfo(callCtx, &pb.ClusterInfoRequest{})
		cancel()
		if err != nil {
			continue
		}
		for _, member := range resp.GetNodes() {
			if member.GetAddress() == "" {
				continue
			}
			if err := w.addNode(ctx, member.GetAddress()); err != nil {
				w.Logger.Warn("timeshard worker: can not dial a node", "address", member.GetAddress(), "error", err)
			}
		}
		return
	}
}

func (w *Worker) knownNodes() []*node {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*node, 0, len(w.order))
	for _, a := range w.order {
		out = append(out, w.nodes[a])
	}
	return out
}

// addNode dials a node not known yet and starts one claim loop per job type on it.
func (w *Worker) addNode(ctx context.Context, address string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.nodes[address]; ok {
		return nil
	}
	n, err := newNode(w.cfg, address)
	if err != nil {
		return err
	}
	w.nodes[address] = n
	w.order = append(w.order, address)
	for _, spec := range w.handlers {
		w.loops.Add(1)
		go func() {
			defer w.loops.Done()
			w.claimLoop(ctx, n, spec)
		}()
	}
	return nil
}

// targets is where a job's heartbeats and results go: its own node first, then the others.
func (w *Worker) targets(home *node) []*node {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := []*node{home}
	for _, a := range w.order {
		if n := w.nodes[a]; n != home {
			out = append(out, n)
		}
	}
	return out
}

// claimLoop long-polls one node for one job type, asking for that type's free slots.
func (w *Worker) claimLoop(ctx context.Context, n *node, spec *handlerSpec) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		reserved, freed := spec.slots.reserve()
		if reserved == 0 {
			select {
			case <-ctx.Done():
			case <-freed:
			}
			continue
		}
		wait := w.pollWait()
		req := &pb.ClaimRequest{
			WorkerId:      w.ID,
			Types:         []string{spec.jobType},
			MaxJobs:       int32(min(reserved, 1000)),
			Wait:          durationpb.New(wait),
			Lease:         durationpb.New(w.Lease),
			MaxReplyBytes: maxReplyBytes,
		}
		sent := time.Now() // monotonic: the lease is counted from before the claim was sent
		callCtx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
		resp, err := n.worker.Claim(callCtx, req)
		cancel()
		if err != nil {
			spec.slots.claimed(reserved, 0)
			if ctx.Err() != nil {
				return
			}
			w.Logger.Warn("timeshard worker: claim failed", "node", n.address, "error", translate(ctx, err), "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(5*time.Second, backoff*2)
			continue
		}
		backoff = 100 * time.Millisecond
		jobs := resp.GetJobs()
		spec.slots.claimed(reserved, len(jobs))
		for _, claimed := range jobs {
			w.start(ctx, n, spec, claimed, sent) // (or given back unstarted: never dropped)
		}
	}
}
