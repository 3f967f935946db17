// Conformance C1, C2, C3 and C9 against one real server: the client's surface, its typed errors,
// and jobs that succeed, retry and die.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  AlreadyExistsError,
  Client,
  FailedPreconditionError,
  InvalidArgumentError,
  JobState,
  NotFoundError,
  PermanentError,
  UnavailableError,
  Worker,
  type JobContext,
} from "../src/index.js";
import { closedPort, eventually, startServer, type TestServer } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer({ types: { "c2.flaky": { max_attempts: 5, retry_base: 0.2 } } });
  client = new Client({ servers: [server.address], tlsDir: false, token: "" });
});

after(async () => {
  client.close();
  await server.stop();
});

async function withWorker(
  setup: (w: Worker) => void,
  body: (w: Worker) => Promise<void>,
): Promise<void> {
  const worker = new Worker({ servers: [server.address], tlsDir: false, token: "", leaseMs: 6000 });
  setup(worker);
  const running = worker.run();
  try {
    await body(worker);
  } finally {
    worker.stop(0);
    await running;
  }
}

async function finished(jobId: string, state: JobState): Promise<void> {
  await eventually(async () => (await client.get(jobId)).state === state, `${jobId} ${JobState[state]}`);
}

describe("C1 schedule, run, succeeded", () => {
  it("runs the job once, no earlier than its run_at, and the handler sees its lateness", async () => {
    const seen: Array<{ ctx: JobContext; lateness: number }> = [];
    await withWorker(
      (w) =>
        w.handle("c1.echo", async (ctx) => {
          seen.push({ ctx, lateness: ctx.startedAt - ctx.runAt });
        }),
      async () => {
        const { job, created } = await client.schedule("c1.echo", { delayMs: 500, payload: "hi" });
        assert.ok(created);
        await finished(job.jobId, JobState.JOB_STATE_SUCCEEDED);
        assert.equal(seen.length, 1);
        const { ctx, lateness } = seen[0]!;
        assert.equal(ctx.jobId, job.jobId);
        assert.equal(ctx.payload.toString(), "hi");
        assert.equal(ctx.runAt, job.runAt!.getTime());
        assert.ok(lateness >= 0, `started ${lateness} ms before its run_at`);
        assert.equal(ctx.attempt, 1);
        assert.ok(ctx.fence > 0);
        console.log(`C1 lateness: ${lateness} ms`);
      },
    );
  });
});

describe("C2 a handler error is retried", () => {
  it("retries with the type's backoff and succeeds on a later attempt", async () => {
    const attempts: number[] = [];
    const started: number[] = [];
    await withWorker(
      (w) =>
        w.handle("c2.flaky", async (ctx) => {
          attempts.push(ctx.attempt);
          started.push(ctx.startedAt);
          if (ctx.attempt < 3) throw new Error(`flaky ${ctx.attempt}`);
        }),
      async () => {
        const { job } = await client.schedule("c2.flaky", {});
        await finished(job.jobId, JobState.JOB_STATE_SUCCEEDED);
        assert.deepEqual(attempts, [1, 2, 3]);
        const got = await client.get(job.jobId);
        assert.equal(got.attempt, 3);
        assert.deepEqual(
          got.history.map((a) => a.outcome),
          ["retry", "retry", "succeeded"],
        );
        assert.match(got.history[0]!.error, /flaky 1/);
        assert.match(got.history[1]!.error, /flaky 2/);
        for (let i = 1; i < got.history.length; i++) {
          const [prev, next] = [got.history[i - 1]!, got.history[i]!];
          assert.ok(next.startedAt! >= prev.finishedAt!, `attempt ${i + 1} started before attempt ${i} ended`);
        }
      },
    );
  });
});

describe("C3 a permanent error dead-letters the job", () => {
  it("lists, replays and purges it", async () => {
    let fail = true;
    await withWorker(
      (w) =>
        w.handle("c3.bad", async () => {
          if (fail) throw new PermanentError("bad payload: no such customer");
        }),
      async () => {
        const { job } = await client.schedule("c3.bad", { maxAttempts: 5 });
        await finished(job.jobId, JobState.JOB_STATE_DEAD);
        const dead = await client.listDeadLetters({ type: "c3.bad" });
        assert.deepEqual(dead.items.map((j) => j.jobId), [job.jobId]);
        assert.match(dead.items[0]!.lastError, /bad payload: no such customer/);
        assert.equal(dead.items[0]!.attempt, 1, "a permanent error is not retried");

        fail = false;
        const replayed = await client.replayDeadLetters({ jobIds: [job.jobId] });
        assert.deepEqual(replayed.map((j) => j.jobId), [job.jobId]);
        await finished(job.jobId, JobState.JOB_STATE_SUCCEEDED);

        fail = true;
        const again = await client.schedule("c3.bad", {});
        await finished(again.job.jobId, JobState.JOB_STATE_DEAD);
        assert.deepEqual(await client.purgeDeadLetters({ type: "c3.bad" }), [again.job.jobId]);
        assert.deepEqual((await client.listDeadLetters({ type: "c3.bad" })).items, []);
        await assert.rejects(client.get(again.job.jobId), NotFoundError);
      },
    );
  });
});

describe("C9 client surface", () => {
  it("schedules with a delay or a time, an idempotency key and max attempts", async () => {
    const at = Date.now() + 3_600_000;
    const byTime = await client.schedule("c9.t", { runAt: at, maxAttempts: 7, payload: new Uint8Array([1, 2]) });
    assert.equal(byTime.job.runAt!.getTime(), at);
    assert.equal(byTime.job.maxAttempts, 7);
    assert.deepEqual([...byTime.job.payload], [1, 2]);
    assert.equal(byTime.job.state, JobState.JOB_STATE_SCHEDULED);

    const before = Date.now();
    const byDelay = await client.schedule("c9.t", { delayMs: 60_000 });
    assert.ok(byDelay.job.runAt!.getTime() >= before + 60_000 - 1000);

    const first = await client.schedule("c9.t", { delayMs: 60_000, idempotencyKey: "k-1" });
    const repeat = await client.schedule("c9.t", { delayMs: 60_000, idempotencyKey: "k-1" });
    assert.equal(first.created, true);
    assert.equal(repeat.created, false);
    assert.equal(repeat.job.jobId, first.job.jobId);
    await assert.rejects(
      client.schedule("c9.t", { delayMs: 60_000, idempotencyKey: "k-1", payload: "other" }),
      AlreadyExistsError,
    );
  });

  it("schedules many, gets, lists, cancels and reschedules", async () => {
    const many = await client.scheduleMany([
      { type: "c9.many", delayMs: 3_600_000 },
      { type: "c9.many", runAt: new Date(Date.now() + 7_200_000), payload: "b" },
    ]);
    assert.equal(many.length, 2);
    assert.ok(many.every((s) => s.created));
    const [a, b] = many.map((s) => s.job.jobId) as [string, string];
    assert.equal((await client.get(b)).payload.toString(), "b");

    const listed = await client.list({ type: "c9.many", state: JobState.JOB_STATE_SCHEDULED });
    assert.deepEqual(listed.items.map((j) => j.jobId).sort(), [a, b].sort());
    const page = await client.list({ type: "c9.many", pageSize: 1 });
    assert.equal(page.items.length, 1);
    assert.notEqual(page.nextPageToken, "");

    const to = Date.now() + 10_000_000;
    assert.equal((await client.reschedule(a, { runAt: to })).runAt!.getTime(), to);
    assert.equal((await client.cancel(a)).state, JobState.JOB_STATE_CANCELLED);
    await assert.rejects(client.cancel(a), FailedPreconditionError);
    await assert.rejects(client.reschedule(a, { delayMs: 1000 }), FailedPreconditionError);

    // One bad item fails the batch, and nothing of it is created.
    await assert.rejects(
      client.scheduleMany([
        { type: "c9.batch", delayMs: 1000 },
        { type: "c9.batch", delayMs: -1 },
      ]),
      (e: unknown) => e instanceof InvalidArgumentError && /1/.test(e.details),
    );
    assert.deepEqual((await client.list({ type: "c9.batch" })).items, []);
  });

  it("creates, previews, pauses, resumes and deletes schedules", async () => {
    const created = await client.createSchedule({
      scheduleId: "c9-nightly",
      cron: "0 3 * * *",
      timezone: "Europe/Paris",
      type: "c9.report",
      misfire: "skip",
    });
    assert.equal(created.scheduleId, "c9-nightly");
    assert.equal(created.paused, false);
    assert.ok(created.nextFire);
    await assert.rejects(
      client.createSchedule({ scheduleId: "c9-nightly", cron: "0 4 * * *", timezone: "UTC", type: "c9.report" }),
      AlreadyExistsError,
    );
    assert.equal((await client.pauseSchedule("c9-nightly")).paused, true);
    assert.equal((await client.resumeSchedule("c9-nightly")).paused, false);
    assert.deepEqual((await client.listSchedules()).items.map((s) => s.scheduleId), ["c9-nightly"]);
    // 02:30 does not exist in Berlin on 2026-03-29: that run is at the end of the skipped hour.
    const times = await client.previewSchedule("30 2 * * *", {
      timezone: "Europe/Berlin",
      from: Date.UTC(2026, 2, 28),
      count: 2,
    });
    assert.deepEqual(
      times.map((t) => t.utc!.toISOString()),
      ["2026-03-28T01:30:00.000Z", "2026-03-29T01:00:00.000Z"],
    );
    await client.deleteSchedule("c9-nightly");
    await assert.rejects(client.getSchedule("c9-nightly"), NotFoundError);
  });

  it("pages a schedule's revisions, reads one and rolls back to one", async () => {
    const spec = { scheduleId: "c9-digest", cron: "0 8 * * *", timezone: "UTC", type: "c9.digest" };
    await client.createSchedule({ ...spec, reason: "weekly digest" });
    await client.pauseSchedule("c9-digest", { reason: "incident 7" });
    await client.resumeSchedule("c9-digest");
    const first = await client.scheduleHistory("c9-digest", { pageSize: 2 });
    assert.deepEqual(
      first.items.map((r) => [r.revision, r.change, r.actor, r.reason]),
      [
        [3, "resume", "anonymous", ""],
        [2, "pause", "anonymous", "incident 7"],
      ],
    );
    assert.ok(first.nextPageToken);
    const rest = await client.scheduleHistory("c9-digest", { pageSize: 2, pageToken: first.nextPageToken });
    assert.deepEqual(rest.items.map((r) => [r.revision, r.change, r.reason]), [[1, "create", "weekly digest"]]);
    assert.equal(rest.nextPageToken, "");
    assert.ok(rest.items[0]!.at instanceof Date);
    assert.equal((await client.getScheduleRevision("c9-digest", 2)).schedule!.paused, true);
    const back = await client.rollbackSchedule("c9-digest", 1, { reason: "undo" });
    assert.equal(back.revision, 3); // revision 1's definition is the schedule's now: no revision
    await assert.rejects(client.getScheduleRevision("c9-digest", 9), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.match(e.details, /keeps revisions 1-3/);
      return true;
    });
    await assert.rejects(client.rollbackSchedule("c9-digest", 9), NotFoundError);
    await assert.rejects(client.scheduleHistory("c9-ghost"), NotFoundError);
    await assert.rejects(client.scheduleHistory("c9-digest", { pageSize: 101 }), InvalidArgumentError);
    assert.equal(await client.deleteSchedule("c9-digest"), 4);
    assert.equal((await client.scheduleHistory("c9-digest")).items[0]!.change, "delete");
    await assert.rejects(client.rollbackSchedule("c9-digest", 1), FailedPreconditionError);
  });

  it("lists an empty dead-letter queue, and refuses a replay naming ids and a type", async () => {
    assert.deepEqual((await client.listDeadLetters({ type: "c9.none" })).items, []);
    await assert.rejects(
      client.replayDeadLetters({ jobIds: ["a"], type: "c9.none" } as unknown as { type: string }),
      InvalidArgumentError,
    );
  });

  it("maps each refusal to its typed error", async () => {
    await assert.rejects(client.get("no-such-job"), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.match(e.message, /^NOT_FOUND: /);
      return true;
    });
    await assert.rejects(client.schedule("c9.t", { delayMs: -5 }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.match(e.details, /delay/);
      return true;
    });
    await assert.rejects(client.schedule("", {}), InvalidArgumentError);
    await assert.rejects(client.createSchedule({ scheduleId: "x", cron: "not a cron", timezone: "UTC", type: "t" }), InvalidArgumentError);
    const down = new Client({ servers: [await closedPort()], tlsDir: false, token: "", timeoutMs: 3000 });
    try {
      await assert.rejects(down.get("x"), UnavailableError);
    } finally {
      down.close();
    }
    assert.throws(() => new Client({ servers: ["no-port"] }), /expected host:port/);
  });
});

describe("job types: pause, resume and a rate", () => {
  it("holds a paused type's due job, runs it once resumed, and sets and refuses rates", async () => {
    assert.equal((await client.pauseType("flow.t")).paused, true);
    await withWorker(
      (w) => w.handle("flow.t", async () => {}),
      async () => {
        const { job } = await client.schedule("flow.t", { payload: "{}" });
        await eventually(async () => {
          const [info] = await client.listTypes("flow.t");
          return info?.held === "paused" && info.ready === 1;
        }, "the job held as paused");
        assert.equal((await client.get(job.jobId)).state, JobState.JOB_STATE_SCHEDULED);
        assert.equal((await client.resumeType("flow.t")).paused, false);
        await finished(job.jobId, JobState.JOB_STATE_SUCCEEDED);
      },
    );
    const limited = await client.setTypeRate("flow.t", 20, 5);
    assert.equal(limited.rate, 20);
    assert.equal(limited.burst, 5);
    await assert.rejects(client.setTypeRate("flow.t", -1), InvalidArgumentError);
    assert.equal((await client.setTypeRate("flow.t", 0)).rate, 0);
  });
});
