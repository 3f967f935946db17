// Handlers' results and tracebacks, and waiting for jobs, against one real server: what a
// handler returns reaches its job, one that can not be stored makes the job dead saying why, a
// thrown error's stack is kept on its attempt, and a wait ends with the jobs, NotFound or its
// timeout.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  Client,
  DeadlineExceededError,
  JobState,
  MAX_RESULT_BYTES,
  NoResultError,
  NotFoundError,
  PermanentError,
  WaitTimeoutError,
  Worker,
  resultOf,
  type Handler,
  type Job,
} from "../src/index.js";
import { startServer, type TestServer } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ servers: [server.address], tlsDir: false, token: "" });
});

after(async () => {
  client.close();
  await server.stop();
});

/** Run `body` with a worker serving `handlers`, stopped after it. */
async function withHandlers(handlers: Record<string, Handler>, body: () => Promise<void>): Promise<void> {
  const worker = new Worker({ servers: [server.address], tlsDir: false, token: "", leaseMs: 6000 });
  for (const [type, fn] of Object.entries(handlers)) worker.handle(type, fn);
  const running = worker.run();
  try {
    await body();
  } finally {
    worker.stop(0);
    await running;
  }
}

/** Schedule a job of `type` (one attempt unless said) and wait for it to finish. */
async function run(type: string, maxAttempts = 1): Promise<Job> {
  const { job } = await client.schedule(type, { maxAttempts });
  return client.wait(job.jobId, { timeoutMs: 20_000 });
}

describe("a handler's result", () => {
  it("reaches its job as JSON or as bytes, read through wait and get", async () => {
    const value = { sum: 3, items: ["a", "é"], nested: { ok: true, none: null } };
    const bytes = new Uint8Array([0, 255, 1, 128]);
    await withHandlers(
      {
        "res.json": async () => value,
        "res.text": async () => "plain",
        "res.bytes": async () => bytes,
        "res.buffer": async () => Buffer.from("raw"),
        "res.none": async () => undefined,
      },
      async () => {
        const json = await run("res.json");
        assert.equal(json.state, JobState.JOB_STATE_SUCCEEDED);
        assert.equal(json.resultEncoding, "json");
        assert.equal(json.result.toString("utf8"), JSON.stringify(value));
        assert.deepEqual(resultOf(json), value);
        const got = await client.get(json.jobId);
        assert.deepEqual(resultOf(got), value);

        assert.equal(resultOf<string>(await run("res.text")), "plain");

        const raw = await run("res.bytes");
        assert.equal(raw.resultEncoding, "bytes");
        assert.deepEqual([...resultOf<Buffer>(raw)], [...bytes]);
        assert.deepEqual([...resultOf<Buffer>(await client.get(raw.jobId))], [...bytes]);
        assert.equal(resultOf<Buffer>(await run("res.buffer")).toString(), "raw");

        const none = await run("res.none");
        assert.equal(none.state, JobState.JOB_STATE_SUCCEEDED);
        assert.equal(none.resultEncoding, "");
        assert.throws(
          () => resultOf(none),
          (e: unknown) => e instanceof NoResultError && /succeeded without a result/.test(e.message),
        );
      },
    );
  });

  it("that can not be stored makes the job dead at once, with a message that says why", async () => {
    await withHandlers(
      {
        "res.bigint": async () => ({ n: 1n }),
        "res.cycle": async () => {
          const a: Record<string, unknown> = {};
          a.self = a;
          return a;
        },
        "res.function": async () => () => 1,
        "res.big-json": async () => "x".repeat(MAX_RESULT_BYTES),
        "res.big-bytes": async () => Buffer.alloc(MAX_RESULT_BYTES + 1),
        "res.at-limit": async () => Buffer.alloc(MAX_RESULT_BYTES, 7),
      },
      async () => {
        const expect: Array<[string, RegExp]> = [
          ["res.bigint", /^ResultError: the handler returned an Object that is not JSON-serialisable \(TypeError: .*BigInt/],
          ["res.cycle", /^ResultError: the handler returned an Object that is not JSON-serialisable \(TypeError: .*circular/],
          ["res.function", /^ResultError: the handler returned a function, which JSON can not encode/],
          [
            "res.big-json",
            // the string's JSON is its characters and two quotes
            /^ResultError: the handler's result is 262146 bytes, over the limit of 262144 bytes; keep large output elsewhere and return a reference to it$/,
          ],
          ["res.big-bytes", /^ResultError: the handler's result is 262145 bytes, over the limit of 262144 bytes/],
        ];
        for (const [type, message] of expect) {
          const job = await run(type, 5);
          assert.equal(job.state, JobState.JOB_STATE_DEAD, type);
          assert.equal(job.attempt, 1, `${type}: not retried`);
          assert.match(job.lastError, message);
          assert.equal(job.history[0]!.outcome, "dead", type);
          assert.equal(job.resultEncoding, "");
          assert.throws(
            () => resultOf(job),
            (e: unknown) => e instanceof NoResultError && e.message.includes("is dead, so it has no result"),
          );
        }
        const full = await run("res.at-limit");
        assert.equal(full.state, JobState.JOB_STATE_SUCCEEDED);
        assert.equal(resultOf<Buffer>(full).length, MAX_RESULT_BYTES);
      },
    );
  });
});

describe("a thrown error", () => {
  it("keeps its stack, with its causes, on the attempt", async () => {
    async function chargeTheCard(): Promise<never> {
      throw new Error("card declined");
    }
    await withHandlers(
      {
        "tb.retry": async () => chargeTheCard(),
        "tb.permanent": async () => {
          try {
            await chargeTheCard();
          } catch (cause) {
            throw new PermanentError("no way to charge", { cause });
          }
        },
        "tb.string": async () => {
          throw "not an Error";
        },
      },
      async () => {
        const retried = await run("tb.retry");
        assert.equal(retried.state, JobState.JOB_STATE_DEAD);
        const attempt = retried.history[0]!;
        assert.equal(attempt.error, "Error: card declined");
        assert.match(attempt.traceback, /^Error: card declined\n\s+at chargeTheCard /);

        const permanent = (await run("tb.permanent", 5)).history[0]!;
        assert.equal(permanent.error, "PermanentError: no way to charge");
        assert.match(
          permanent.traceback,
          /^PermanentError: no way to charge\n\s+at [^]*\nCaused by: Error: card declined\n\s+at chargeTheCard /,
        );

        const thrown = (await run("tb.string")).history[0]!;
        assert.equal(thrown.error, "not an Error");
        assert.equal(thrown.traceback, "", "a thrown string has no stack to send");
      },
    );
  });
});

describe("waiting for jobs", () => {
  it("returns each job once finished, in the order they finish, and waitMany by id", async () => {
    let release: () => void = () => undefined;
    const released = new Promise<void>((r) => (release = r));
    await withHandlers(
      {
        "wait.quick": async (ctx) => ctx.payload.toString(),
        "wait.held": async () => {
          await released;
          return "held";
        },
      },
      async () => {
        const held = (await client.schedule("wait.held", { maxAttempts: 1 })).job.jobId;
        const quick = (await client.schedule("wait.quick", { maxAttempts: 1, payload: "q" })).job.jobId;
        const order: string[] = [];
        for await (const job of client.asFinished([held, quick, held], { timeoutMs: 20_000 })) {
          order.push(job.jobId);
          if (job.jobId === quick) release();
        }
        assert.deepEqual(order, [quick, held], "each job once, the quick one first");

        const done = await client.waitMany([held, quick], { timeoutMs: 0 });
        assert.deepEqual([...done.keys()], [held, quick]);
        assert.deepEqual([...done.values()].map((j) => resultOf(j)), ["held", "q"]);
      },
    );
  });

  it("of an unknown id is NotFound", async () => {
    await assert.rejects(client.wait("no-such-job", { timeoutMs: 5000 }), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.match(e.details, /no-such-job/);
      return true;
    });
  });

  it("past its timeout is a WaitTimeoutError naming the jobs not finished", async () => {
    const later = (await client.schedule("wait.later", { delayMs: 3_600_000 })).job.jobId;
    const started = Date.now();
    await assert.rejects(client.wait(later, { timeoutMs: 400 }), (e: unknown) => {
      assert.ok(e instanceof WaitTimeoutError);
      assert.ok(e instanceof DeadlineExceededError);
      assert.deepEqual(e.pending, [later]);
      assert.equal(e.timeoutMs, 400);
      assert.match(e.message, /^DEADLINE_EXCEEDED: 1 job\(s\) not finished within 400 ms: /);
      return true;
    });
    assert.ok(Date.now() - started >= 400, "gave up before its timeout");

    // The jobs finished before the timeout are handed out first.
    const { job } = await client.schedule("wait.later", { delayMs: 3_600_000 });
    const cancelled = job.jobId;
    await client.cancel(cancelled);
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const job of client.asFinished([later, cancelled], { timeoutMs: 0 })) seen.push(job.jobId);
      })(),
      (e: unknown) => e instanceof WaitTimeoutError && e.pending.join() === later,
    );
    assert.deepEqual(seen, [cancelled]);
    assert.throws(() => resultOf(job), /is scheduled, not finished/);
  });

  it("left early ends its call, and the client goes on", async () => {
    const later = (await client.schedule("wait.later", { delayMs: 3_600_000 })).job.jobId;
    const cancelled = (await client.schedule("wait.later", { delayMs: 3_600_000 })).job.jobId;
    await client.cancel(cancelled);
    for await (const job of client.asFinished([cancelled, later])) {
      assert.equal(job.jobId, cancelled);
      break; // the wait for `later` would last an hour
    }
    assert.equal((await client.wait(cancelled)).state, JobState.JOB_STATE_CANCELLED);
  });
});
