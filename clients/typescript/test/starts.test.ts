// No real server: start notices, jobs given back unstarted, and the client's retries of an
// overloaded node, against a fake node (test/fake.ts) that answers late, holds or refuses.
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import { status } from "@grpc/grpc-js";
import {
  Client,
  ConfigError,
  InvalidArgumentError,
  NOT_STARTED,
  ResourceExhaustedError,
  Worker,
  type JobContext,
  type WorkerEvent,
} from "../src/index.js";
import { MAX_RETRY_AFTER_MS, readRetryAfter } from "../src/errors.js";
import { claimedJob, refusal, startFakeNode, type FakeNode } from "./fake.js";
import { eventually } from "./helpers.js";

let node: FakeNode;

beforeEach(async () => {
  node = await startFakeNode();
});

afterEach(async () => {
  await node.close();
});

function fakeWorker(leaseMs: number, safetyMarginMs: number, events: Array<[WorkerEvent, string, string]> = []): Worker {
  return new Worker({
    servers: [node.address],
    discover: false,
    tlsDir: false,
    token: "",
    leaseMs,
    safetyMarginMs,
    claimWaitMs: 500,
    warn: () => undefined,
    onEvent: (e, ctx, detail) => events.push([e, ctx.jobId, detail]),
  });
}

/** The fake's first claim answers `jobs` (after `delayMs`); later ones are empty long polls. */
function firstClaimAnswers(jobs: ReturnType<typeof claimedJob>[], delayMs = 0): void {
  node.claim = async (n, req, cancelled) => {
    if (n === 1) {
      await new Promise((r) => setTimeout(r, delayMs));
      return { jobs };
    }
    const waitMs = (req.wait?.seconds ?? 0) * 1000 + (req.wait?.nanos ?? 0) / 1e6;
    await Promise.race([new Promise((r) => setTimeout(r, waitMs)), cancelled]);
    return { jobs: [] };
  };
}

describe("the start notice", () => {
  it("goes as the handler starts, without the handler waiting for its answer, and every later heartbeat says started", async () => {
    firstClaimAnswers([claimedJob("j1", "t", 7, 3000)]);
    let releaseHeartbeats!: () => void;
    const released = new Promise<void>((r) => (releaseHeartbeats = r));
    node.heartbeat = async (req) => {
      await released; // the node holds its answers
      return { lease: req.lease, leaseUntil: new Date(Date.now() + 3000) };
    };
    let started: JobContext | undefined;
    let finish!: () => void;
    const finished = new Promise<void>((r) => (finish = r));
    const worker = fakeWorker(3000, 300);
    worker.handle("t", async (ctx) => {
      started = ctx;
      await finished;
    });
    const running = worker.run();
    try {
      const ctx = await eventually(() => started, "the handler to start while its notice is unanswered", 5000);
      const notice = await eventually(() => node.heartbeats[0], "the start notice", 5000);
      assert.equal(notice.jobId, "j1");
      assert.equal(notice.fence, 7);
      assert.equal(notice.started, true);
      assert.equal(notice.startedAt?.getTime(), ctx.startedAt);
      assert.ok(Date.now() - ctx.startedAt < 1000, "the notice waited for the heartbeat period");
      releaseHeartbeats();
      const next = await eventually(() => node.heartbeats[1], "the next heartbeat", 5000);
      assert.equal(next.started, true);
      assert.equal(next.startedAt?.getTime(), ctx.startedAt);
      finish();
      const result = await eventually(() => node.finished[0], "the result", 5000);
      assert.equal(result.jobId, "j1");
      assert.equal(result.failed, false);
      assert.equal(result.notStarted, false);
    } finally {
      releaseHeartbeats();
      finish();
      worker.stop(0);
      await running;
    }
  });
});

describe("a job the worker does not start", () => {
  it("is given back at once, unstarted, when its claim answer arrives after its lease", async () => {
    firstClaimAnswers([claimedJob("late", "t", 11, 2000)], 2000);
    const events: Array<[WorkerEvent, string, string]> = [];
    let ran = false;
    const worker = fakeWorker(2000, 300, events);
    worker.handle("t", async () => {
      ran = true;
    }, { concurrency: 1 });
    const running = worker.run();
    try {
      const item = await eventually(() => node.finished[0], "the give-back", 10_000);
      assert.deepEqual(
        { jobId: item.jobId, fence: item.fence, failed: item.failed, giveBack: item.giveBack, notStarted: item.notStarted, error: item.error },
        { jobId: "late", fence: 11, failed: true, giveBack: true, notStarted: true, error: NOT_STARTED.late },
      );
      // The slot is free again: the next claim asks for it.
      const next = await eventually(() => node.claims[1], "the next claim", 5000);
      assert.equal(next.maxJobs, 1);
      await eventually(() => events.length > 0, "the event", 5000);
    } finally {
      worker.stop(0);
      await running;
    }
    assert.equal(ran, false, "the handler of a job given back ran");
    assert.deepEqual(node.heartbeats, [], "heartbeats for a job never started");
    assert.deepEqual(events, [["not started", "late", NOT_STARTED.late]]);
  });

  it("is given back unstarted when the worker stops while it waits for a slot, and its heartbeats never said started", async () => {
    // Two jobs for one slot, as when two nodes answer at once: the second waits for the first.
    firstClaimAnswers([claimedJob("first", "t", 1, 3000), claimedJob("second", "t", 2, 3000)]);
    const events: Array<[WorkerEvent, string, string]> = [];
    const started: string[] = [];
    const worker = fakeWorker(3000, 300, events);
    worker.handle("t", async (ctx) => {
      started.push(ctx.jobId);
      await new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }));
    }, { concurrency: 1 });
    const running = worker.run();
    await eventually(() => started.length === 1, "the first handler to start", 5000);
    await eventually(() => node.heartbeats.some((h) => h.jobId === "second"), "a heartbeat of the waiting job", 5000);
    worker.stop(0);
    await running;
    assert.deepEqual(started, ["first"]);
    for (const h of node.heartbeats) assert.equal(h.started, h.jobId === "first", `heartbeat ${JSON.stringify(h)}`);
    const byJob = new Map(node.finished.map((item) => [item.jobId, item]));
    assert.equal(byJob.get("first")?.giveBack, true);
    assert.equal(byJob.get("first")?.notStarted, false, "a started handler's give-back is not unstarted");
    assert.equal(byJob.get("second")?.giveBack, true);
    assert.equal(byJob.get("second")?.notStarted, true);
    assert.equal(byJob.get("second")?.error, NOT_STARTED.stopping);
    assert.ok(events.some(([e, id]) => e === "not started" && id === "second"));
  });

  it("needs a safety margin under half the lease, and a long poll that leaves the margin", () => {
    assert.throws(() => new Worker({ leaseMs: 2000, safetyMarginMs: 1000 }), (e: unknown) => e instanceof ConfigError && /leaseMs \/ 2/.test(e.message));
    const w = new Worker({ leaseMs: 2000, safetyMarginMs: 900, claimWaitMs: 20_000 });
    const wait = (w as unknown as { claimWaitMs: number }).claimWaitMs;
    assert.ok(2000 - 900 - wait >= 900, `a long poll of ${wait} ms leaves less than the margin`);
  });
});

describe("an overloaded node", () => {
  const refuseFirst = (times: number, trailers: Record<string, string>) => {
    node.schedule = (n) =>
      n <= times ? refusal(status.RESOURCE_EXHAUSTED, "too many due jobs wait for a worker on this node", trailers) : undefined;
  };

  it("is asked again after the time it names, for one job and for a batch", async () => {
    refuseFirst(2, { "retry-after-ms": "80" });
    const client = new Client({ servers: [node.address], tlsDir: false, token: "" });
    try {
      const began = Date.now();
      const { created } = await client.schedule("t");
      assert.equal(created, true);
      assert.equal(node.scheduleCalls, 3);
      assert.ok(Date.now() - began >= 160, "retried before the 2 x 80 ms the node asked for");
      refuseFirst(4, { "retry-after-ms": "10" }); // call 4 refused, call 5 taken
      assert.equal((await client.scheduleMany([{ type: "t" }, { type: "t" }])).length, 2);
      assert.equal(node.scheduleCalls, 5);
    } finally {
      client.close();
    }
  });

  it("is retried at most overloadRetries times, then the error carries the node's wait", async () => {
    refuseFirst(1000, { "retry-after-ms": "5" });
    const client = new Client({ servers: [node.address], tlsDir: false, token: "" });
    const none = new Client({ servers: [node.address], tlsDir: false, token: "", overloadRetries: 0 });
    try {
      await assert.rejects(client.schedule("t"), (e: unknown) => e instanceof ResourceExhaustedError && e.retryAfterMs === 5);
      assert.equal(node.scheduleCalls, 6);
      await assert.rejects(none.schedule("t"), ResourceExhaustedError);
      assert.equal(node.scheduleCalls, 7);
    } finally {
      client.close();
      none.close();
    }
  });

  it("is waited for at most overloadBudgetMs in all; a refusal naming no wait means 1 s", async () => {
    refuseFirst(1000, { "retry-after-ms": "60" });
    const client = new Client({ servers: [node.address], tlsDir: false, token: "", overloadBudgetMs: 150 });
    try {
      await assert.rejects(client.schedule("t"), ResourceExhaustedError);
      assert.equal(node.scheduleCalls, 3, "two waits of 60-66 ms fit in 150 ms, a third does not");
      refuseFirst(1000, {});
      const short = new Client({ servers: [node.address], tlsDir: false, token: "", overloadBudgetMs: 500 });
      try {
        await assert.rejects(short.schedule("t"), (e: unknown) => e instanceof ResourceExhaustedError && e.retryAfterMs === undefined);
        assert.equal(node.scheduleCalls, 4, "a 1 s wait does not fit in 500 ms");
      } finally {
        short.close();
      }
    } finally {
      client.close();
    }
  });

  it("is the only refusal retried so", async () => {
    node.schedule = () => refusal(status.INVALID_ARGUMENT, "delay: must not be negative", { "retry-after-ms": "1" });
    const client = new Client({ servers: [node.address], tlsDir: false, token: "" });
    try {
      await assert.rejects(client.schedule("t"), InvalidArgumentError);
      assert.equal(node.scheduleCalls, 1);
    } finally {
      client.close();
    }
  });

  it("names its wait in retry-after-ms, read capped at 30 s", () => {
    assert.equal(readRetryAfter(undefined), undefined);
    assert.equal(readRetryAfter("1500"), 1500);
    assert.equal(readRetryAfter(" 250 "), 250);
    assert.equal(readRetryAfter("0"), 0);
    assert.equal(readRetryAfter("40000"), MAX_RETRY_AFTER_MS);
    assert.equal(readRetryAfter(""), undefined);
    assert.equal(readRetryAfter("soon"), undefined);
    assert.equal(readRetryAfter("-3"), undefined);
    assert.equal(readRetryAfter(Buffer.from("120")), 120);
  });
});
