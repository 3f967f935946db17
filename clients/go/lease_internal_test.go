package timeshard

import (
	"context"
	"errors"
	"testing"
	"time"
	"unicode/utf8"
)

// A process paused past its lease sees it at the handler's next step: Err and Check read the
// deadline from the monotonic clock when asked, with no timer or goroutine having run.
func TestAnExpiredLeaseIsSeenWhenAskedWithoutATimer(t *testing.T) {
	l := &lease{deadline: time.Now().Add(time.Hour)}
	base, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx := &leaseContext{Context: base, lease: l, cancel: cancel}
	job := &JobContext{lease: l}
	if ctx.Err() != nil || job.Check() != nil {
		t.Fatal("a held lease reads as lost")
	}
	l.mu.Lock()
	l.deadline = time.Now().Add(-time.Millisecond) // as if the process slept past it
	l.mu.Unlock()
	if !errors.Is(job.Check(), ErrLeaseLost) {
		t.Fatalf("Check: %v", job.Check())
	}
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), ErrLeaseLost) {
		t.Fatalf("Err %v, cause %v", ctx.Err(), context.Cause(ctx))
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("Done is not closed once Err saw the lease over")
	}
}

// A heartbeat never moves the deadline back.
func TestTheDeadlineNeverMovesBack(t *testing.T) {
	later := time.Now().Add(time.Hour)
	l := &lease{deadline: later}
	l.extend(later.Add(-time.Minute))
	if !l.until().Equal(later) {
		t.Fatalf("deadline moved back to %s", l.until())
	}
	l.extend(later.Add(time.Minute))
	if !l.until().Equal(later.Add(time.Minute)) {
		t.Fatal("a later deadline was not taken")
	}
}

// Slots: a claim in flight holds what it asked for; the limit is never passed, and a type
// claims again only once a quarter of its slots are free.
func TestSlotsNeverPassTheLimit(t *testing.T) {
	s := newSlots(8)
	n, _ := s.reserve()
	if n != 8 {
		t.Fatalf("an idle type asks for %d", n)
	}
	if m, freed := s.reserve(); m != 0 || freed == nil {
		t.Fatalf("a second claim while the first is in flight asks for %d", m)
	}
	s.claimed(8, 8)
	s.release()
	if m, _ := s.reserve(); m != 0 {
		t.Fatalf("with 1 of 8 free it asks for %d (wants a quarter)", m)
	}
	s.release()
	if m, _ := s.reserve(); m != 2 {
		t.Fatalf("with 2 of 8 free it asks for %d", m)
	}
	if s.running()+2 > s.limit {
		t.Fatal("held and asked pass the limit")
	}
}

func TestLongErrorsAreCutAtACharacterBoundary(t *testing.T) {
	long := ""
	for len(long) < 2*maxErrorBytes {
		long += "é"
	}
	cut := truncateError(long)
	if len(cut) > maxErrorBytes || !utf8.ValidString(cut) {
		t.Fatalf("cut to %d bytes, valid %v", len(cut), utf8.ValidString(cut))
	}
}
