package timeshard

// Schedule and ScheduleMany against a node that refuses due-now jobs while overloaded
// (RESOURCE_EXHAUSTED with retry-after-ms): retried after the time named, within the budget.

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// refuse makes the fake node answer its first `times` scheduling calls RESOURCE_EXHAUSTED with
// retry-after-ms `after` ("" names none), and the rest OK.
func refuse(f *fakeNode, times int, after string) {
	f.schedule = func(ctx context.Context, n int) error {
		if n > times {
			return nil
		}
		if after != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after-ms", after))
		}
		return status.Error(codes.ResourceExhausted, "too many due jobs wait for a worker on this node")
	}
}

func fakeClient(t *testing.T, f *fakeNode) *Client {
	t.Helper()
	c, err := NewClient(f.config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAnOverloadedNodeIsAskedAgainAfterTheTimeItNames(t *testing.T) {
	f := startFakeNode(t)
	refuse(f, 2, "80")
	c := fakeClient(t, f)
	began := time.Now()
	done, err := c.Schedule(context.Background(), NewJob{Type: "t"})
	if err != nil || !done.Created {
		t.Fatalf("schedule: %v %v", done, err)
	}
	if f.scheduleCalls() != 3 {
		t.Fatalf("%d calls, want 3", f.scheduleCalls())
	}
	if took := time.Since(began); took < 160*time.Millisecond {
		t.Fatalf("retried after %s, before the 2 x 80 ms the node asked for", took)
	}
	refuse(f, 4, "10") // calls 4 (refused) and 5 (taken): a batch too
	if made, err := c.ScheduleMany(context.Background(), []NewJob{{Type: "t"}, {Type: "t"}}); err != nil || len(made) != 2 {
		t.Fatalf("schedule many: %v %v", made, err)
	}
	if f.scheduleCalls() != 5 {
		t.Fatalf("%d calls, want 5", f.scheduleCalls())
	}
}

// At most OverloadRetries retries: then the refusal is the caller's, with the node's wait.
func TestOverloadRetriesAreBoundedInNumber(t *testing.T) {
	f := startFakeNode(t)
	refuse(f, 1000, "5")
	c := fakeClient(t, f)
	_, err := c.Schedule(context.Background(), NewJob{Type: "t"})
	var refused *Error
	if !errors.Is(err, ErrResourceExhausted) || !errors.As(err, &refused) || refused.RetryAfter != 5*time.Millisecond {
		t.Fatalf("err %v", err)
	}
	if f.scheduleCalls() != 1+DefaultOverloadRetries {
		t.Fatalf("%d calls, want %d", f.scheduleCalls(), 1+DefaultOverloadRetries)
	}
	c.OverloadRetries = 0
	before := f.scheduleCalls()
	if _, err := c.Schedule(context.Background(), NewJob{Type: "t"}); !errors.Is(err, ErrResourceExhausted) || f.scheduleCalls() != before+1 {
		t.Fatalf("with no retries: %v after %d calls", err, f.scheduleCalls()-before)
	}
}

// At most OverloadBudget of waiting in all, and no wait past the context's deadline; a
// refusal that names no wait means 1 s.
func TestOverloadRetriesAreBoundedInTime(t *testing.T) {
	f := startFakeNode(t)
	refuse(f, 1000, "60")
	c := fakeClient(t, f)
	c.OverloadBudget = 150 * time.Millisecond // two waits of 60-66 ms fit, a third does not
	if _, err := c.Schedule(context.Background(), NewJob{Type: "t"}); !errors.Is(err, ErrResourceExhausted) || f.scheduleCalls() != 3 {
		t.Fatalf("%v after %d calls, want 3", err, f.scheduleCalls())
	}

	refuse(f, 1000, "") // 1 s, over a budget of 500 ms: no retry
	c.OverloadBudget = 500 * time.Millisecond
	before := f.scheduleCalls()
	_, err := c.Schedule(context.Background(), NewJob{Type: "t"})
	var refused *Error
	if !errors.As(err, &refused) || refused.RetryAfter != 0 || f.scheduleCalls() != before+1 {
		t.Fatalf("%v after %d calls", err, f.scheduleCalls()-before)
	}

	refuse(f, 1000, "400")
	c.OverloadBudget = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	before = f.scheduleCalls()
	began := time.Now()
	if _, err := c.Schedule(ctx, NewJob{Type: "t"}); !errors.Is(err, ErrResourceExhausted) || f.scheduleCalls() != before+1 {
		t.Fatalf("%v after %d calls", err, f.scheduleCalls()-before)
	}
	if took := time.Since(began); took > 150*time.Millisecond {
		t.Fatalf("waited %s for a retry the deadline would cut", took)
	}
}

// Other refusals are not retried.
func TestOnlyResourceExhaustedIsRetriedAsOverload(t *testing.T) {
	f := startFakeNode(t)
	f.schedule = func(ctx context.Context, n int) error {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after-ms", "1"))
		return status.Error(codes.InvalidArgument, "delay: must not be negative")
	}
	c := fakeClient(t, f)
	if _, err := c.Schedule(context.Background(), NewJob{Type: "t"}); !errors.Is(err, ErrInvalidArgument) || f.scheduleCalls() != 1 {
		t.Fatalf("%v after %d calls", err, f.scheduleCalls())
	}
}

func TestRetryAfterIsReadCappedAndDefaulted(t *testing.T) {
	for _, c := range []struct {
		values []string
		want   time.Duration
		named  bool
	}{
		{nil, DefaultRetryAfter, false},
		{[]string{"1500"}, 1500 * time.Millisecond, true},
		{[]string{" 250 "}, 250 * time.Millisecond, true},
		{[]string{"0"}, 0, true},
		{[]string{"40000"}, MaxRetryAfter, true},
		{[]string{"1e12"}, MaxRetryAfter, true},
		{[]string{"soon"}, DefaultRetryAfter, false},
		{[]string{"-3"}, DefaultRetryAfter, false},
		{[]string{"NaN"}, DefaultRetryAfter, false},
	} {
		md := metadata.MD{}
		if c.values != nil {
			md.Set("retry-after-ms", c.values...)
		}
		if got, named := retryAfter(md); got != c.want || named != c.named {
			t.Errorf("%q: %s %v, want %s %v", c.values, got, named, c.want, c.named)
		}
	}
}
