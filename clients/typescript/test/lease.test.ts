// Conformance C4, C5, C6 and C10: a worker that can not renew stops its handler in time, a
// cancel reaches a running handler, a killed worker's job runs again after its lease, and a job
// whose claim answer comes after its lease is given back unstarted.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { after, before, describe, it } from "node:test";
import { Client, JobState, LeaseLostError, NOT_STARTED, Worker, type JobContext, type WorkerEvent } from "../src/index.js";
import { cleanEnv, eventually, startProxy, startServer, type Proxy, type TestServer } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer({ types: { "c4.long": { retry_base: 0.1 }, "c6.hang": { retry_base: 0.1 } } });
  client = new Client({ servers: [server.address], tlsDir: false, token: "" });
});

after(async () => {
  client.close();
  await server.stop();
});

const LEASE_MS = 3000;
const MARGIN_MS = 500;

/** The running job once the node has its handler's start notice (from then on a lease that runs
 * out is a failed attempt; before it, a delivery that never started, given back uncounted). */
async function startNoticed(jobId: string) {
  return eventually(async () => {
    const j = await client.get(jobId);
    return j.state === JobState.JOB_STATE_RUNNING && j.startNoticed && j;
  }, `the start notice of ${jobId}`);
}

describe("C4 a handler that outlives a lease it can not renew", () => {
  it("is aborted before lease - safety margin and the job runs again elsewhere with a higher fence", async () => {
    const proxy = await startProxy(server.address);
    let first: { fence: number; startedAt: number; abortedAt: number; reason: unknown } | undefined;
    let abortedWall = 0;
    const cut = new Worker({
      servers: [proxy.address],
      discover: false,
      tlsDir: false,
      token: "",
      leaseMs: LEASE_MS,
      safetyMarginMs: MARGIN_MS,
      warn: () => undefined,
    });
    let noticed!: () => void;
    const noticeIn = new Promise<void>((r) => (noticed = r));
    let frozen = false;
    cut.handle("c4.long", async (ctx) => {
      const startedAt = performance.now();
      await Promise.race([noticeIn, new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }))]);
      proxy.freeze(); // from now on no heartbeat (and no result) gets through
      frozen = true;
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
      first = { fence: ctx.fence, startedAt, abortedAt: performance.now(), reason: ctx.signal.reason };
      abortedWall = Date.now();
    });
    const cutRun = cut.run();
    const { job } = await client.schedule("c4.long", {});
    await startNoticed(job.jobId); // the cut comes once the attempt counts
    noticed();
    await eventually(() => frozen, "the handler to cut the proxy");
    // Read after the cut: no heartbeat gets through any more, so this lease is the last granted.
    const held = await client.get(job.jobId);
    assert.equal(held.state, JobState.JOB_STATE_RUNNING);
    await eventually(() => first, "the cut-off worker's handler to be aborted", 15_000);
    assert.ok(abortedWall < held.leaseUntil!.getTime(), "aborted after the lease the server granted");
    const f = first!;
    // Its deadline was (the last granted heartbeat sent) + lease - margin, the start notice at the
    // earliest: not sooner (the lease timer is set 5 ms ahead, so it lands before the deadline).
    assert.ok(
      f.abortedAt >= f.startedAt + LEASE_MS - MARGIN_MS - 100,
      `aborted ${f.abortedAt - f.startedAt} ms after the start, before the lease could have run out`,
    );
    assert.ok(f.reason instanceof LeaseLostError);

    let second: { fence: number; startedAt: number } | undefined;
    const healthy = new Worker({ servers: [server.address], tlsDir: false, token: "", leaseMs: LEASE_MS });
    healthy.handle("c4.long", async (ctx) => {
      second = { fence: ctx.fence, startedAt: performance.now() };
    });
    const healthyRun = healthy.run();
    try {
      await eventually(async () => (await client.get(job.jobId)).state === JobState.JOB_STATE_SUCCEEDED, "the rerun", 20_000);
      assert.ok(second, "the job ran again");
      assert.ok(second.fence > f.fence, `fence ${second.fence} not above ${f.fence}`);
      assert.ok(second.startedAt > f.abortedAt, "the rerun started before the first handler was stopped");
      const got = await client.get(job.jobId);
      assert.equal(got.history[0]!.outcome, "lease expired");
      assert.equal(got.attempt, 2);
    } finally {
      healthy.stop(0);
      cut.stop(0);
      await Promise.all([healthyRun, cutRun]);
      proxy.close();
    }
  });
});

describe("C5 cancel of a running job", () => {
  it("aborts the handler's signal at the next heartbeat and reports nothing", async () => {
    const events: WorkerEvent[] = [];
    let started = false;
    let reason: unknown;
    const worker = new Worker({
      servers: [server.address],
      tlsDir: false,
      token: "",
      leaseMs: LEASE_MS,
      onEvent: (e) => events.push(e),
      warn: () => undefined,
    });
    worker.handle("c5.long", async (ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
      reason = ctx.signal.reason;
    });
    const running = worker.run();
    try {
      const { job } = await client.schedule("c5.long", {});
      await eventually(() => started, "the handler to start");
      assert.equal((await client.cancel(job.jobId)).state, JobState.JOB_STATE_CANCELLED);
      await eventually(() => reason, "the handler's signal to abort", 10_000);
      assert.ok(reason instanceof LeaseLostError);
      assert.match((reason as Error).message, /no longer this worker's.*FAILED_PRECONDITION/);
      await eventually(() => events.includes("lost"), "the worker to drop the job");
      assert.ok(!events.includes("succeeded") && !events.includes("failed"));
      assert.equal((await client.get(job.jobId)).state, JobState.JOB_STATE_CANCELLED);
    } finally {
      worker.stop(0);
      await running;
    }
  });
});

describe("C6 a worker killed mid-job", () => {
  it("leaves the job to run again after its lease", async () => {
    const { job } = await client.schedule("c6.hang", {});
    const child = spawn(process.execPath, [new URL("./fixtures/hang-worker.js", import.meta.url).pathname], {
      env: cleanEnv({ TIMESHARD_SERVER: server.address }),
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
    const line = await eventually(() => /started (\S+) (\d+)/.exec(out) ?? undefined, "the child's handler to start", 15_000);
    assert.equal(line[1], job.jobId);
    const held = await startNoticed(job.jobId); // killed once the attempt counts
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGKILL");
    await exited;

    let rerun: { fence: number; startedAt: number; attempt: number } | undefined;
    const worker = new Worker({ servers: [server.address], tlsDir: false, token: "", leaseMs: LEASE_MS });
    worker.handle("c6.hang", async (ctx) => {
      rerun = { fence: ctx.fence, startedAt: ctx.startedAt, attempt: ctx.attempt };
    });
    const running = worker.run();
    try {
      await eventually(async () => (await client.get(job.jobId)).state === JobState.JOB_STATE_SUCCEEDED, "the rerun", 20_000);
      assert.ok(rerun);
      assert.ok(rerun.fence > Number(line[2]));
      assert.equal(rerun.attempt, 2);
      assert.ok(rerun.startedAt >= held.leaseUntil!.getTime(), "the rerun started before the dead worker's lease ended");
      assert.equal((await client.get(job.jobId)).history[0]!.outcome, "lease expired");
    } finally {
      worker.stop(0);
      await running;
    }
  });
});

describe("C10 a claim answer that arrives after the job's deadline", () => {
  it("is not started but given back at once, uncounted, and the job then runs as its first attempt", async () => {
    const proxy = await startProxy(server.address);
    const events: Array<[WorkerEvent, string, string]> = [];
    const runs: JobContext[] = [];
    const LATE_LEASE_MS = 6000;
    const LATE_MARGIN_MS = 1500;
    const worker = new Worker({
      servers: [proxy.address],
      discover: false,
      tlsDir: false,
      token: "",
      workerId: "slow-link",
      leaseMs: LATE_LEASE_MS,
      safetyMarginMs: LATE_MARGIN_MS,
      claimWaitMs: 2000,
      warn: () => undefined,
      onEvent: (e, ctx, detail) => events.push([e, ctx.jobId, detail]),
    });
    worker.handle("c10.late", async (ctx) => {
      runs.push(ctx);
    }, { concurrency: 1 });
    const running = worker.run();
    try {
      const warm = await client.schedule("c10.late", {});
      await eventually(async () => (await client.get(warm.job.jobId)).state === JobState.JOB_STATE_SUCCEEDED, "the warm-up job");
      const { jobId, leaseUntil } = await claimWithAnswerHeld(proxy, "c10.late");
      // Let the answer through after the worker's deadline for it (the claim was sent before the
      // lease began: at most lease_until - margin) and before the lease's end, so the give-back
      // is the worker's own and not the node's expiry of a lease without a start notice.
      await new Promise((r) => setTimeout(r, leaseUntil - LATE_MARGIN_MS + 300 - Date.now()));
      proxy.release();
      const first = await eventually(() => events.find(([, id]) => id === jobId), "the late job's event");
      assert.deepEqual(first, ["not started", jobId, NOT_STARTED.late]);
      const job = await eventually(async () => {
        const j = await client.get(jobId);
        return j.state === JobState.JOB_STATE_SUCCEEDED && j;
      }, "the job to run after its give-back");
      assert.deepEqual(
        job.history.map((h) => [h.outcome, h.error]),
        [["not started", NOT_STARTED.late], ["succeeded", ""]],
      );
      assert.equal(job.attempt, 1, "the delivery that did not start was counted");
      assert.equal(job.unstarted, 1);
      assert.deepEqual(runs.filter((r) => r.jobId === jobId).map((r) => r.attempt), [1]);
    } finally {
      proxy.release();
      worker.stop(0);
      await running;
      proxy.close();
    }
  });
});

/** Schedule a job for the worker behind `proxy` while the proxy holds what the node sends, so the
 * worker's waiting long poll claims it and the answer stays in the proxy; the job's id and
 * lease_until (epoch ms). If that poll ended empty before the job was due, its empty answer is the
 * one held and nothing claims the job: it is cancelled, the proxy released, and tried again. */
async function claimWithAnswerHeld(proxy: Proxy, type: string): Promise<{ jobId: string; leaseUntil: number }> {
  for (let attempt = 1; attempt <= 3; attempt++) {
    proxy.hold();
    const { job } = await client.schedule(type, { maxAttempts: 1 });
    const until = Date.now() + 5000;
    while (Date.now() < until) {
      const j = await client.get(job.jobId);
      if (j.state === JobState.JOB_STATE_RUNNING) return { jobId: j.jobId, leaseUntil: j.leaseUntil!.getTime() };
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal((await client.cancel(job.jobId)).state, JobState.JOB_STATE_CANCELLED);
    proxy.release();
    await new Promise((r) => setTimeout(r, 500)); // the worker polls again
  }
  throw new Error("no claim took the job while the proxy held the node's answers, in 3 tries");
}

describe("graceful shutdown", () => {
  it("lets a short handler finish, stops a long one after the drain and gives its job back", async () => {
    let longStarted = false;
    let shortStarted = false;
    const events: Array<[WorkerEvent, string]> = [];
    const worker = new Worker({
      servers: [server.address],
      tlsDir: false,
      token: "",
      leaseMs: 10_000,
      onEvent: (e, ctx) => events.push([e, ctx.type]),
    });
    worker.handle("stop.long", async (ctx) => {
      longStarted = true;
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    });
    worker.handle("stop.short", async () => {
      shortStarted = true;
      await new Promise((r) => setTimeout(r, 300));
    });
    const running = worker.run();
    const long = await client.schedule("stop.long", { maxAttempts: 1 });
    const short = await client.schedule("stop.short", {});
    await eventually(() => longStarted && shortStarted, "both handlers to start");
    worker.stop(1000);
    await running;
    assert.equal((await client.get(short.job.jobId)).state, JobState.JOB_STATE_SUCCEEDED);
    const given = await client.get(long.job.jobId);
    assert.equal(given.state, JobState.JOB_STATE_SCHEDULED, "a job given back is scheduled again");
    assert.equal(given.attempt, 0, "a give back does not count as an attempt");
    assert.equal(given.history.at(-1)!.outcome, "given back");
    assert.deepEqual(events.filter(([e]) => e === "given back"), [["given back", "stop.long"]]);
  });
});
