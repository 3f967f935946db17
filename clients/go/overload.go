package timeshard

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// retryAfterKey is the trailing metadata of a RESOURCE_EXHAUSTED answer that says how long to
// wait, in milliseconds.
const retryAfterKey = "retry-after-ms"

// retryOverload runs a scheduling call (through call, so UNAVAILABLE is handled as everywhere
// else) and tries it again while the node answers RESOURCE_EXHAUSTED: a node over --max-ready
// refuses due-now jobs before it stores anything, so repeating is safe even without an
// idempotency key. Each wait is the node's retry-after-ms (retryAfter), within the client's
// budget: at most OverloadRetries retries and OverloadBudget of waiting in all, and no wait
// that would end past the context's deadline. A loop without a bound would only add load to
// a node that said it has too much.
func retryOverload[T any](ctx context.Context, c *Client, idempotent bool, fn func(context.Context, int, grpc.CallOption) (T, error)) (T, error) {
	var waited time.Duration
	for retries := 0; ; retries++ {
		var trailer metadata.MD
		out, err := call(ctx, c, idempotent, func(ctx context.Context, i int) (T, error) {
			return fn(ctx, i, grpc.Trailer(&trailer))
		})
		if codeOf(err) != codes.ResourceExhausted {
			return out, err
		}
		wait, named := retryAfter(trailer)
		var refused *Error
		if errors.As(err, &refused) && named {
			refused.RetryAfter = wait
		}
		wait += time.Duration(rand.Int64N(int64(wait/10) + 1)) // clients refused together do not come back together
		if retries >= c.OverloadRetries || waited+wait > c.OverloadBudget || endsPastDeadline(ctx, wait) {
			return out, err
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return out, ctx.Err()
		case <-timer.C:
		}
		waited += wait
	}
}

// retryAfter reads a refusal's retry-after-ms: the wait it names, capped at MaxRetryAfter, and
// whether it named one (DefaultRetryAfter when it did not, or named something unreadable).
func retryAfter(trailer metadata.MD) (time.Duration, bool) {
	values := trailer.Get(retryAfterKey)
	if len(values) == 0 {
		return DefaultRetryAfter, false
	}
	ms, err := strconv.ParseFloat(strings.TrimSpace(values[0]), 64)
	if err != nil || ms < 0 || math.IsNaN(ms) {
		return DefaultRetryAfter, false
	}
	if ms >= float64(MaxRetryAfter/time.Millisecond) {
		return MaxRetryAfter, true
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

// endsPastDeadline: a wait the context's deadline would cut short is not worth starting (the
// retry after it could not be made).
func endsPastDeadline(ctx context.Context, wait time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < wait
}
