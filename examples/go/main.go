// Schedule a job from Go, run it in a Go worker, print its lateness.
//
//	timeshard dev --port 50051 &          # or any cluster: TIMESHARD_SERVER=host:port,...
//	cd examples/go && go run .
//
// TIMESHARD_SERVER, TIMESHARD_TLS_DIR and TIMESHARD_TOKEN are read as by every SDK.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := timeshard.ConfigFromEnv()
	client, err := timeshard.NewClient(cfg)
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	done := make(chan time.Duration, 1)

	worker := timeshard.NewWorker(cfg)
	worker.Handle("example.greet", timeshard.HandlerOptions{Concurrency: 4, Timeout: 10 * time.Second},
		func(ctx context.Context, job *timeshard.JobContext) error {
			fmt.Printf("hello %s (job %s, attempt %d, fence %d)\n", job.Payload, job.JobID, job.Attempt, job.Fence)
			done <- job.Lateness()
			return nil
		})
	workerCtx, stopWorker := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(workerCtx) }()

	scheduled, err := client.Schedule(ctx, timeshard.NewJob{
		Type:    "example.greet",
		Payload: []byte(`"from Go"`),
		Delay:   time.Second,
	})
	if err != nil {
		stopWorker()
		return err
	}
	fmt.Printf("scheduled %s, due at %s\n", scheduled.Job.GetJobId(), scheduled.Job.GetRunAt().AsTime().Format(time.RFC3339Nano))

	select {
	case lateness := <-done:
		fmt.Printf("lateness: %.1f ms\n", float64(lateness.Microseconds())/1000)
	case <-ctx.Done():
		stopWorker()
		return fmt.Errorf("the job did not run within a minute: is a node serving at %v?", cfg.Servers)
	}
	stopWorker()
	if err := <-stopped; err != nil {
		return err
	}
	job, err := client.Get(ctx, scheduled.Job.GetJobId())
	if err != nil {
		return err
	}
	fmt.Printf("state: %s\n", job.GetState())
	return nil
}
