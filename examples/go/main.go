// Schedule a job from Go, run it in a Go worker, wait for it and print its result.
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

	worker := timeshard.NewWorker(cfg)
	worker.HandleResult("example.greet", timeshard.HandlerOptions{Concurrency: 4, Timeout: 10 * time.Second},
		func(ctx context.Context, job *timeshard.JobContext) (any, error) {
			fmt.Printf("hello %s (job %s, attempt %d, fence %d)\n", job.Payload, job.JobID, job.Attempt, job.Fence)
			// The return value is kept with the job (as JSON) for whoever waits for it.
			return map[string]any{"greeted": string(job.Payload), "lateness_ms": float64(job.Lateness().Microseconds()) / 1000}, nil
		})
	workerCtx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(workerCtx) }()

	scheduled, err := client.Schedule(ctx, timeshard.NewJob{
		Type:    "example.greet",
		Payload: []byte(`"from Go"`),
		Delay:   time.Second,
	})
	if err != nil {
		return err
	}
	fmt.Printf("scheduled %s, due at %s\n", scheduled.Job.GetJobId(), scheduled.Job.GetRunAt().AsTime().Format(time.RFC3339Nano))

	// Waiting is a server-side stream (WaitJobs), not polling.
	job, err := client.Wait(ctx, scheduled.Job.GetJobId(), 30*time.Second)
	if err != nil {
		return fmt.Errorf("waiting for the job (is a node serving at %v?): %w", cfg.Servers, err)
	}
	var result struct {
		Greeted    string  `json:"greeted"`
		LatenessMs float64 `json:"lateness_ms"`
	}
	if err := timeshard.DecodeResult(job, &result); err != nil {
		return err
	}
	fmt.Printf("state: %s, result: greeted %s, lateness %.1f ms\n", job.GetState(), result.Greeted, result.LatenessMs)
	stopWorker()
	return <-stopped
}
