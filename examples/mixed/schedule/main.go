// The scheduling side of the mixed example: a Go client schedules jobs that a TypeScript worker
// (../worker) runs.
//
//	go run . [N]      # N jobs of type mixed.greet, due one second from now (default 3)
//
// TIMESHARD_SERVER, TIMESHARD_TLS_DIR and TIMESHARD_TOKEN are read as by every SDK.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

func main() {
	n := 3
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil || v < 1 || v > 1000 {
			fmt.Fprintln(os.Stderr, "schedule: N must be a number from 1 to 1000")
			os.Exit(2)
		}
		n = v
	}
	if err := run(n); err != nil {
		fmt.Fprintln(os.Stderr, "schedule:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	client, err := timeshard.NewClient(timeshard.ConfigFromEnv())
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < n; i++ {
		scheduled, err := client.Schedule(ctx, timeshard.NewJob{
			Type:    "mixed.greet",
			Payload: []byte(fmt.Sprintf(`{"from": "Go", "n": %d}`, i)),
			Delay:   time.Second,
		})
		if err != nil {
			return err
		}
		fmt.Printf("scheduled %s\n", scheduled.Job.GetJobId())
	}
	return nil
}
