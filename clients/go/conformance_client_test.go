package timeshard_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	timeshard "github.com/timeshard/timeshard/clients/go"
)

// addToken adds a role token to dir/auth.toml and returns it.
func addToken(t *testing.T, dir, name, role string) string {
	t.Helper()
	out := strings.Fields(cliRun(t, dir, "tokens", "add", name, "--role", role, "--file", "auth.toml"))
	return out[len(out)-1]
}

// C7: TLS and mutual TLS with a bearer token: refused without or with a wrong token
// (UNAUTHENTICATED), accepted with the right one.
func TestC7TLSAndTokens(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	cliRun(t, dir, "certs", "init", "tls", "--hosts", "localhost,127.0.0.1")
	client := addToken(t, dir, "app", "client")
	worker := addToken(t, dir, "workers", "worker")
	tlsDir := filepath.Join(dir, "tls")
	// A directory with the CA only: TLS without a client certificate.
	caOnly := filepath.Join(dir, "ca-only")
	if err := os.Mkdir(caOnly, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(filepath.Join(tlsDir, "ca.pem"))
	if err := os.WriteFile(filepath.Join(caOnly, "ca.pem"), ca, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []struct {
		name  string
		flags []string
		dir   string
	}{
		{"tls", nil, caOnly},
		{"mtls", []string{"--mtls"}, tlsDir},
	} {
		t.Run(mode.name, func(t *testing.T) {
			sub := filepath.Join(dir, "node-"+mode.name)
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--tls-dir", tlsDir, "--auth-file", filepath.Join(dir, "auth.toml")}, mode.flags...)
			s := startServer(t, sub, args...)
			cfg := func(token, tls string) timeshard.Config {
				return timeshard.Config{Servers: []string{s.Address}, TLSDir: tls, Token: token}
			}
			list := func(c timeshard.Config) error {
				cl := newClient(t, c)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _, err := cl.List(ctx, timeshard.ListOptions{PageSize: 1})
				return err
			}
			if err := list(cfg("", mode.dir)); !errors.Is(err, timeshard.ErrUnauthenticated) {
				t.Fatalf("no token: %v", err)
			}
			if err := list(cfg("ts_not-a-real-token", mode.dir)); !errors.Is(err, timeshard.ErrUnauthenticated) {
				t.Fatalf("wrong token: %v", err)
			}
			if err := list(cfg(worker, mode.dir)); !errors.Is(err, timeshard.ErrPermissionDenied) {
				t.Fatalf("a worker's token on the JobService: %v", err)
			}
			if err := list(cfg(client, "")); !errors.Is(err, timeshard.ErrUnavailable) {
				t.Fatalf("plaintext to a TLS node: %v", err)
			}
			if mode.name == "mtls" {
				if err := list(cfg(client, caOnly)); !errors.Is(err, timeshard.ErrUnavailable) {
					t.Fatalf("no client certificate under mTLS: %v", err)
				}
			}
			if err := list(cfg(client, mode.dir)); err != nil {
				t.Fatalf("the right token: %v", err)
			}
			// The whole path with the right tokens, the environment as the Python SDK reads it.
			t.Setenv(timeshard.EnvServer, s.Address)
			t.Setenv(timeshard.EnvTLSDir, mode.dir)
			t.Setenv(timeshard.EnvToken, client)
			c := newClient(t, timeshard.ConfigFromEnv())
			t.Setenv(timeshard.EnvToken, worker)
			w := newWorker(timeshard.ConfigFromEnv())
			ran := make(chan string, 1)
			w.Handle("c7.secure", timeshard.HandlerOptions{}, func(ctx context.Context, job *timeshard.JobContext) error {
				ran <- job.JobID
				return nil
			})
			runWorker(t, w)
			done, err := c.Schedule(context.Background(), timeshard.NewJob{Type: "c7.secure"})
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, c, done.Job.GetJobId(), timeshard.StateSucceeded, 30*time.Second)
			if got := <-ran; got != done.Job.GetJobId() {
				t.Fatalf("ran %s", got)
			}
		})
	}
}

// C9: the client surface, and errors mapped to typed errors by gRPC status.
func TestC9ClientSurface(t *testing.T) {
	s := startServer(t, "")
	c := newClient(t, s.config())
	ctx := context.Background()

	// Schedule: by delay, by time, with an idempotency key, with max attempts.
	later, err := c.Schedule(ctx, timeshard.NewJob{Type: "c9.a", Payload: []byte("{}"), Delay: time.Hour, MaxAttempts: 7})
	if err != nil || !later.Created || later.Job.GetMaxAttempts() != 7 {
		t.Fatalf("by delay: %+v %v", later, err)
	}
	at := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	timed, err := c.Schedule(ctx, timeshard.NewJob{Type: "c9.a", RunAt: at})
	if err != nil || !timed.Job.GetRunAt().AsTime().Equal(at) {
		t.Fatalf("by time: %v, run_at %v want %v", err, timed.Job.GetRunAt().AsTime(), at)
	}
	keyed := timeshard.NewJob{Type: "c9.a", Payload: []byte(`{"n":1}`), Delay: time.Hour, IdempotencyKey: "order-1"}
	first, err := c.Schedule(ctx, keyed)
	if err != nil || !first.Created || first.Job.GetIdempotencyKey() != "order-1" {
		t.Fatalf("keyed: %+v %v", first, err)
	}
	repeat, err := c.Schedule(ctx, keyed)
	if err != nil || repeat.Created || repeat.Job.GetJobId() != first.Job.GetJobId() {
		t.Fatalf("repeat of a key: %+v %v", repeat, err)
	}
	keyed.Payload = []byte(`{"n":2}`)
	if _, err := c.Schedule(ctx, keyed); !errors.Is(err, timeshard.ErrAlreadyExists) {
		t.Fatalf("the key with another body: %v", err)
	}
	// Schedule many: all or nothing, in order.
	many, err := c.ScheduleMany(ctx, []timeshard.NewJob{{Type: "c9.b", Delay: time.Hour}, {Type: "c9.b", Delay: time.Hour}})
	if err != nil || len(many) != 2 || many[0].Job.GetJobId() == many[1].Job.GetJobId() {
		t.Fatalf("schedule many: %+v %v", many, err)
	}
	if _, err := c.ScheduleMany(ctx, []timeshard.NewJob{{Type: "c9.c"}, {Type: "c9.c", Delay: -time.Second}}); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("a bad item: %v", err)
	}
	// Get, list, reschedule, cancel.
	got, err := c.Get(ctx, later.Job.GetJobId())
	if err != nil || got.GetType() != "c9.a" || got.GetState() != timeshard.StateScheduled {
		t.Fatalf("get: %v %v", got, err)
	}
	listed, _, err := c.List(ctx, timeshard.ListOptions{Type: "c9.b", PageSize: 10})
	if err != nil || len(listed) != 2 {
		t.Fatalf("list c9.b: %d %v", len(listed), err)
	}
	if none, _, err := c.List(ctx, timeshard.ListOptions{Type: "c9.c"}); err != nil || len(none) != 0 {
		t.Fatalf("the refused batch created %d jobs (%v)", len(none), err)
	}
	moved, err := c.Reschedule(ctx, later.Job.GetJobId(), 3*time.Hour, time.Time{})
	if err != nil || !moved.GetRunAt().AsTime().After(got.GetRunAt().AsTime()) {
		t.Fatalf("reschedule: %v %v", moved, err)
	}
	cancelled, err := c.Cancel(ctx, later.Job.GetJobId())
	if err != nil || cancelled.GetState() != timeshard.StateCancelled {
		t.Fatalf("cancel: %v %v", cancelled, err)
	}
	if _, err := c.Cancel(ctx, later.Job.GetJobId()); !errors.Is(err, timeshard.ErrFailedPrecondition) {
		t.Fatalf("cancel a finished job: %v", err)
	}
	// Errors by status.
	if _, err := c.Get(ctx, "no-such-job"); !errors.Is(err, timeshard.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	if _, err := c.Schedule(ctx, timeshard.NewJob{Type: "c9.a", Delay: -time.Second}); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("negative delay: %v", err)
	} else if e := new(timeshard.Error); !errors.As(err, &e) || !strings.Contains(e.Message, "delay") {
		t.Fatalf("the message should name the field: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	down := newClient(t, timeshard.Config{Servers: []string{closed}})
	down.Retries = 1
	if _, err := down.Get(ctx, "x"); !errors.Is(err, timeshard.ErrUnavailable) {
		t.Fatalf("no node: %v", err)
	}

	// Schedules: create, get, list, pause, resume, preview, delete.
	sched, err := c.CreateSchedule(ctx, &timeshard.Schedule{ScheduleId: "nightly", Cron: "0 2 * * *", Timezone: "Europe/Berlin", Type: "c9.cron"})
	if err != nil || sched.GetNextFire() == nil {
		t.Fatalf("create schedule: %v %v", sched, err)
	}
	if _, err := c.CreateSchedule(ctx, &timeshard.Schedule{ScheduleId: "bad", Cron: "not cron", Timezone: "UTC", Type: "c9.cron"}); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("bad cron: %v", err)
	}
	if _, err := c.CreateSchedule(ctx, &timeshard.Schedule{ScheduleId: "nightly", Cron: "0 3 * * *", Timezone: "UTC", Type: "c9.cron"}); !errors.Is(err, timeshard.ErrAlreadyExists) {
		t.Fatalf("the same id again: %v", err)
	}
	if p, err := c.PauseSchedule(ctx, "nightly"); err != nil || !p.GetPaused() {
		t.Fatalf("pause: %v %v", p, err)
	}
	if r, err := c.ResumeSchedule(ctx, "nightly"); err != nil || r.GetPaused() {
		t.Fatalf("resume: %v %v", r, err)
	}
	if all, _, err := c.ListSchedules(ctx, 10, ""); err != nil || len(all) != 1 {
		t.Fatalf("list schedules: %v %v", all, err)
	}
	from := time.Date(2026, 3, 28, 0, 0, 0, 0, time.UTC)
	times, err := c.PreviewSchedule(ctx, timeshard.Preview{Cron: "30 2 * * *", Timezone: "Europe/Berlin", From: from, Count: 3})
	if err != nil || len(times) != 3 {
		t.Fatalf("preview: %v %v", times, err)
	}
	// 2026-03-29 02:30 does not exist in Berlin: cronie's rule fires it at 03:00 local.
	if got := times[1].GetUtc().AsTime(); !got.Equal(time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)) {
		t.Fatalf("the skipped hour fired at %s (%s)", got, times[1].GetNote())
	}
	if _, err := c.DeleteSchedule(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSchedule(ctx, "nightly"); !errors.Is(err, timeshard.ErrNotFound) {
		t.Fatalf("deleted schedule: %v", err)
	}
	// Dead letters: an empty queue lists nothing; replaying an unknown id is refused.
	if dead, _, err := c.DeadLetters(ctx, timeshard.DeadLetterQuery{}); err != nil || len(dead) != 0 {
		t.Fatalf("dead letters: %v %v", dead, err)
	}
	if _, err := c.ReplayDeadLetters(ctx, []string{"x"}, "c9.a"); !errors.Is(err, timeshard.ErrInvalidArgument) {
		t.Fatalf("ids and a type: %v", err)
	}
}
