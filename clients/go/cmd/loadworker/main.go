// Command loadworker is the Go no-op worker of tools/loadtest.py: it runs "loadtest.noop"
// jobs and notes, for each run, the job id, its due time (epoch ms) and when the handler started
// (wall clock, ms with 3 decimals), one line per run in $TIMESHARD_RECORD:
//
//	<job_id> <run_at> <start_ms>
//
// Lines are buffered and written out at least every 0.2 s, and at exit (SIGTERM, SIGINT).
// It reads TIMESHARD_SERVER, TIMESHARD_TLS_DIR and TIMESHARD_TOKEN as every SDK does, and
// TIMESHARD_CONCURRENCY (handler slots, default 512).
//
//	go build -o /tmp/ts-loadworker ./cmd/loadworker
//	python tools/loadtest.py fire --jobs 20000 --window 0 --worker-command /tmp/ts-loadworker
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

const (
	jobType = "loadtest.noop"
	flushS  = 200 * time.Millisecond
)

// runLog is the buffered record of runs.
type runLog struct {
	mu  sync.Mutex
	out *bufio.Writer
	f   *os.File
}

func (l *runLog) add(jobID string, runAt int64, start time.Time) {
	startMs := float64(start.UnixNano()) / 1e6
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, "%s %d %.3f\n", jobID, runAt, startMs)
}

func (l *runLog) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Flush()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadworker:", err)
		os.Exit(1)
	}
}

func run() error {
	path := os.Getenv("TIMESHARD_RECORD")
	if path == "" {
		return fmt.Errorf("set TIMESHARD_RECORD to the file to note each run in")
	}
	concurrency := 512
	if v := os.Getenv("TIMESHARD_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("TIMESHARD_CONCURRENCY=%q: want a whole number of at least 1", v)
		}
		concurrency = n
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	log := &runLog{out: bufio.NewWriterSize(f, 1<<16), f: f}

	w := timeshard.NewWorker(timeshard.ConfigFromEnv())
	w.Lease = 60 * time.Second
	w.ClaimWait = 5 * time.Second
	w.Handle(jobType, timeshard.HandlerOptions{Concurrency: concurrency, Timeout: time.Minute},
		func(ctx context.Context, job *timeshard.JobContext) error {
			log.add(job.JobID, job.RunAt.UnixMilli(), job.StartedAt)
			return nil
		})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		tick := time.NewTicker(flushS)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = log.flush()
			}
		}
	}()
	runErr := w.Run(ctx)
	<-flushed
	if err := log.flush(); err != nil {
		return err
	}
	return runErr
}
