package timeshard

import (
	"context"
	"time"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// finishBatch is the most results one Finish call carries.
const finishBatch = 500

// node is one node a worker talks to: its channel, and the batcher of the results sent to it.
type node struct {
	address string
	conn    *grpc.ClientConn
	worker  pb.WorkerServiceClient
	admin   pb.AdminServiceClient
	queue   chan finishCall
	done    chan struct{}
}

type finishCall struct {
	ctx   context.Context
	item  *pb.FinishItem
	reply chan finishReply
}

type finishReply struct {
	result *pb.FinishResult
	err    error
}

func newNode(cfg Config, address string) (*node, error) {
	conn, err := cfg.dial(address)
	if err != nil {
		return nil, err
	}
	n := &node{
		address: address,
		conn:    conn,
		worker:  pb.NewWorkerServiceClient(conn),
		admin:   pb.NewAdminServiceClient(conn),
		queue:   make(chan finishCall, 4*finishBatch),
		done:    make(chan struct{}),
	}
	go n.sendResults()
	return n, nil
}

func (n *node) close() {
	close(n.done)
	_ = n.conn.Close()
}

// finish sends one result, in a Finish batch with whatever other results are waiting for this
// node: one round trip for many jobs, and never a wait for a batch to fill.
func (n *node) finish(ctx context.Context, item *pb.FinishItem) (*pb.FinishResult, error) {
	call := finishCall{ctx: ctx, item: item, reply: make(chan finishReply, 1)}
	select {
	case n.queue <- call:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-call.reply:
		return r.result, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (n *node) sendResults() {
	for {
		var batch []finishCall
		select {
		case <-n.done:
			return
		case c := <-n.queue:
			batch = append(batch, c)
		}
	more:
		for len(batch) < finishBatch {
			select {
			case c := <-n.queue:
				batch = append(batch, c)
			default:
				break more
			}
		}
		n.sendBatch(batch)
	}
}

func (n *node) sendBatch(batch []finishCall) {
	// The batch may take as long as the most patient of its items allows.
	var deadline time.Time
	req := &pb.FinishRequest{}
	live := batch[:0]
	for _, c := range batch {
		if c.ctx.Err() != nil {
			c.reply <- finishReply{err: c.ctx.Err()}
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		req.Items = append(req.Items, c.item)
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := n.worker.Finish(ctx, req)
	byID := map[string]*pb.FinishResult{}
	if err == nil {
		for _, r := range resp.GetResults() {
			byID[r.GetJobId()] = r
		}
	}
	for _, c := range live {
		switch r, ok := byID[c.item.GetJobId()]; {
		case err != nil:
			c.reply <- finishReply{err: translate(context.Background(), err)}
		case !ok:
			c.reply <- finishReply{err: &Error{Code: codes.Internal, Message: "no result for job " + c.item.GetJobId()}}
		default:
			c.reply <- finishReply{result: r}
		}
	}
}
