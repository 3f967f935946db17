package timeshard

import "sync"

// slots counts one job type's handlers in this worker: those running (or claimed and about to
// run) and those a claim in flight may bring. Their sum never passes the type's limit, so the
// limit holds across every node the worker polls.
type slots struct {
	mu     sync.Mutex
	limit  int
	held   int // claimed jobs whose handler has not really ended
	asking int // slots reserved by claims in flight
	freed  chan struct{}
	maxRun int // the most held at once (for tests and metrics)
}

func newSlots(limit int) *slots {
	return &slots{limit: limit, freed: make(chan struct{})}
}

// reserve takes up to all free slots for one claim, or none when fewer than a quarter of the
// limit are free (a busy worker claims in batches, not one round trip per finished job). It
// returns how many it took and, when none, a channel closed at the next release.
func (s *slots) reserve() (int, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.limit - s.held - s.asking
	if free <= 0 || (free < s.limit && free < max(1, s.limit/4)) {
		return 0, s.freed
	}
	s.asking += free
	return free, nil
}

// claimed turns n reserved slots into held ones (the jobs a claim brought) and gives back the
// rest of the reservation.
func (s *slots) claimed(reserved, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asking -= reserved
	s.held += n
	s.maxRun = max(s.maxRun, s.held)
	if n < reserved {
		s.wake()
	}
}

// release frees the slot of a job whose handler has really ended.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held--
	s.wake()
}

func (s *slots) wake() {
	close(s.freed)
	s.freed = make(chan struct{})
}

func (s *slots) running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}
