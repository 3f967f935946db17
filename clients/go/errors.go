package timeshard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The errors a call can end with, one per gRPC status the server answers. Test for them with
// errors.Is: errors.Is(err, timeshard.ErrNotFound). The concrete error is an *Error, which
// carries the status code and the server's message.
var (
	ErrInvalidArgument    = errors.New("timeshard: invalid argument")
	ErrNotFound           = errors.New("timeshard: not found")
	ErrAlreadyExists      = errors.New("timeshard: already exists")
	ErrFailedPrecondition = errors.New("timeshard: failed precondition")
	ErrUnavailable        = errors.New("timeshard: unavailable")
	ErrUnauthenticated    = errors.New("timeshard: unauthenticated")
	ErrPermissionDenied   = errors.New("timeshard: permission denied")
	ErrDeadlineExceeded   = errors.New("timeshard: deadline exceeded")
	ErrUnimplemented      = errors.New("timeshard: unimplemented")
	// ErrResourceExhausted: a node refused the call for a limit; for ScheduleJob(s), a node
	// started with --max-ready that has too many due jobs waiting for a worker (the client
	// retries it within its budget first: Client.OverloadRetries, Client.OverloadBudget).
	ErrResourceExhausted = errors.New("timeshard: resource exhausted")
)

var sentinels = map[codes.Code]error{
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.NotFound:           ErrNotFound,
	codes.AlreadyExists:      ErrAlreadyExists,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.Unavailable:        ErrUnavailable,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.PermissionDenied:   ErrPermissionDenied,
	codes.DeadlineExceeded:   ErrDeadlineExceeded,
	codes.Unimplemented:      ErrUnimplemented,
	codes.ResourceExhausted:  ErrResourceExhausted,
}

// WaitTimeoutError is a wait (Client.Wait, WaitMany, AsFinished) whose timeout passed before
// every job was finished; Pending names those that were not. errors.Is(err,
// ErrDeadlineExceeded) is true for it.
type WaitTimeoutError struct {
	Pending []string
	Timeout time.Duration
}

func (e *WaitTimeoutError) Error() string {
	shown := make([]string, 0, 5)
	for _, id := range e.Pending[:min(5, len(e.Pending))] {
		shown = append(shown, strconv.Quote(id))
	}
	more := ""
	if len(e.Pending) > len(shown) {
		more = " ..."
	}
	return fmt.Sprintf("timeshard: %d job(s) not finished within %s: %s%s; wait again, or look at them with `timeshard jobs get`",
		len(e.Pending), e.Timeout, strings.Join(shown, ", "), more)
}

// Is makes errors.Is(err, ErrDeadlineExceeded) true.
func (e *WaitTimeoutError) Is(target error) bool { return target == ErrDeadlineExceeded }

// GRPCStatus lets status.Code see DEADLINE_EXCEEDED, as for the server's own errors.
func (e *WaitTimeoutError) GRPCStatus() *status.Status {
	return status.New(codes.DeadlineExceeded, e.Error())
}

// Error is a call the server (or the gRPC channel) refused: its status code and message.
type Error struct {
	Code    codes.Code
	Message string
	// RetryAfter is how long the node asked the caller to wait before trying again (the
	// `retry-after-ms` trailing metadata of a RESOURCE_EXHAUSTED answer); 0 when it named none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("timeshard: %s: %s", e.Code, e.Message)
}

// Is makes errors.Is(err, ErrNotFound) (and the other sentinels) true for the matching code.
func (e *Error) Is(target error) bool {
	sentinel, ok := sentinels[e.Code]
	return ok && sentinel == target
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// translate turns a gRPC error into an *Error; a context's own cancellation or deadline is
// returned as the context error, so errors.Is(err, context.Canceled) keeps working.
func translate(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &Error{Code: st.Code(), Message: st.Message()}
}

// codeOf is the gRPC status code of err (codes.Unknown for an error without one).
func codeOf(err error) codes.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return status.Code(err)
}
