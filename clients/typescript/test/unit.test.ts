// No server: the lease's deadline on the monotonic clock, the handler slots, and the encoding
// of results.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { NoResultError } from "../src/errors.js";
import { Job, JobState } from "../src/gen/timeshard/v1/timeshard.js";
import { Lease, LeaseLostError, now } from "../src/lease.js";
import {
  MAX_RESULT_BYTES,
  MAX_TRACEBACK_BYTES,
  ResultError,
  encodeResult,
  resultOf,
  tracebackOf,
  truncateTraceback,
} from "../src/returns.js";
import { Slots } from "../src/slots.js";

describe("Lease", () => {
  it("is over the moment a paused process resumes past its deadline", () => {
    const lease = new Lease(now() + 30);
    assert.ok(lease.held());
    const until = now() + 60;
    while (now() < until) {
      // the event loop is blocked: no timer can fire
    }
    assert.equal(lease.held(), false);
    assert.ok(lease.signal.aborted);
    assert.ok(lease.signal.reason instanceof LeaseLostError);
  });

  it("aborts its signal at the deadline unless extended", async () => {
    const lease = new Lease(now() + 100);
    lease.extend(now() + 300);
    await new Promise((r) => setTimeout(r, 150));
    assert.equal(lease.signal.aborted, false);
    await new Promise((r) => setTimeout(r, 250));
    assert.equal(lease.signal.aborted, true);
  });
});

describe("Slots", () => {
  it("never grants more slots than the limit, and hands a freed one to a waiting job", async () => {
    const slots = new Slots();
    slots.define("t", 2);
    const signal = new AbortController().signal;
    const runs = ["a", "b", "c"].map((id) => slots.claimed(id, "t"));
    await slots.acquire(runs[0]!, signal);
    await slots.acquire(runs[1]!, signal);
    let third = false;
    const waiting = slots.acquire(runs[2]!, signal).then(() => (third = true));
    await new Promise((r) => setImmediate(r));
    assert.equal(third, false);
    assert.equal(slots.running("t"), 2);
    assert.equal(slots.toAsk("t"), 0);
    slots.ended(runs[0]!);
    await waiting;
    assert.ok(runs[2]!.hasSlot);
    assert.equal(slots.running("t"), 2);
  });

  it("runs a job's next attempt only after its previous one in this worker ended", async () => {
    const slots = new Slots();
    slots.define("t", 5);
    const signal = new AbortController().signal;
    const first = slots.claimed("j", "t");
    await slots.acquire(first, signal);
    const second = slots.claimed("j", "t");
    let started = false;
    const p = slots.acquire(second, signal).then(() => (started = true));
    await new Promise((r) => setImmediate(r));
    assert.equal(started, false);
    slots.ended(first);
    await p;
    assert.ok(second.hasSlot);
  });
});

describe("bad settings", () => {
  it("are a ConfigError that says what to fix, at construction", async () => {
    const { Client, ConfigError, Worker } = await import("../src/index.js");
    assert.throws(() => new Worker({ leaseMs: 500 }), (e: unknown) => e instanceof ConfigError && /at least 1000/.test(e.message));
    assert.throws(() => new Worker({ leaseMs: 3000, safetyMarginMs: 3000 }), ConfigError);
    const w = new Worker();
    w.handle("t", async () => undefined);
    assert.throws(() => w.handle("t", async () => undefined), /already registered/);
    assert.throws(() => w.handle("u", async () => undefined, { concurrency: 0 }), /from 1 to 1000/);
    assert.throws(
      () => new Client({ servers: ["127.0.0.1:1"], tlsDir: "/no/such/dir" }),
      (e: unknown) => e instanceof ConfigError && /can not read \/no\/such\/dir\/ca.pem/.test(e.message),
    );
    assert.throws(() => new Client({ servers: [" "] }), /TIMESHARD_SERVER/);
    await assert.rejects(new Worker({ servers: ["127.0.0.1:1"] }).run(), /register a handler/);
  });
});

describe("results", () => {
  it("encode as the Python SDK does: nothing, bytes or compact JSON", () => {
    assert.deepEqual(encodeResult(undefined), { result: Buffer.alloc(0), encoding: "" });
    assert.deepEqual(encodeResult(null), { result: Buffer.alloc(0), encoding: "" });
    const view = new Uint8Array([9, 1, 2, 3]).subarray(1);
    assert.deepEqual(encodeResult(view), { result: Buffer.from([1, 2, 3]), encoding: "bytes" });
    assert.deepEqual(encodeResult({ a: [1, "é"], b: false }), {
      result: Buffer.from('{"a":[1,"é"],"b":false}'),
      encoding: "json",
    });
    assert.deepEqual(encodeResult(0), { result: Buffer.from("0"), encoding: "json" });
    assert.deepEqual(encodeResult(new Date(0)), { result: Buffer.from('"1970-01-01T00:00:00.000Z"'), encoding: "json" });
  });

  it("refuse what JSON can not say and what is over the limit, saying why", () => {
    const refused = (value: unknown, message: RegExp) =>
      assert.throws(() => encodeResult(value), (e: unknown) => e instanceof ResultError && message.test(e.message));
    refused(10n, /^the handler returned a bigint that is not JSON-serialisable \(TypeError: Do not know how to serialize a BigInt\); return JSON-serialisable data, a Buffer or Uint8Array, or undefined$/);
    refused(Symbol("s"), /^the handler returned a symbol, which JSON can not encode/);
    refused(new (class Report { toJSON = () => undefined })(), /^the handler returned a Report, which JSON/);
    refused({ toJSON: () => { throw new Error("no") } }, /an Object that is not JSON-serialisable \(Error: no\)/);
    refused("é".repeat(MAX_RESULT_BYTES / 2), /^the handler's result is 262146 bytes, over the limit of 262144 bytes/);
    assert.equal(encodeResult(new Uint8Array(MAX_RESULT_BYTES)).result.length, MAX_RESULT_BYTES);
  });

  it("read back as the value, the bytes, or a NoResultError that says why", () => {
    const job = (fields: Partial<Job>): Job =>
      Job.fromPartial({ jobId: "j1", state: JobState.JOB_STATE_SUCCEEDED, ...fields });
    assert.deepEqual(resultOf(job({ result: Buffer.from('{"n":[1]}'), resultEncoding: "json" })), { n: [1] });
    assert.deepEqual(resultOf(job({ result: Buffer.from([7]), resultEncoding: "bytes" })), Buffer.from([7]));
    const why = (j: Job, message: RegExp) =>
      assert.throws(() => resultOf(j), (e: unknown) => e instanceof NoResultError && e.jobId === "j1" && message.test(e.message));
    why(job({}), /^job "j1" succeeded without a result: its handler returned nothing$/);
    why(job({ result: Buffer.from("x"), resultEncoding: "yaml" }), /encoded as "yaml", which this SDK can not read/);
    why(job({ state: JobState.JOB_STATE_DEAD, lastError: "Error: boom" }), /^job "j1" is dead, so it has no result \(last error: Error: boom\)$/);
    why(job({ state: JobState.JOB_STATE_EXPIRED }), /^job "j1" is expired, so it has no result$/);
    why(job({ state: JobState.JOB_STATE_RUNNING }), /^job "j1" is running, not finished: it has no result yet/);
  });

  it("send a traceback of at most 8000 bytes, its end kept at a character boundary", () => {
    const long = "é".repeat(3000) + "x".repeat(3000) + "\nError: the end";
    const cut = truncateTraceback(long);
    assert.ok(Buffer.byteLength(cut) <= MAX_TRACEBACK_BYTES);
    assert.ok(Buffer.byteLength(cut) >= MAX_TRACEBACK_BYTES - 1, "no more than a character's tail dropped");
    assert.match(cut, /^\(truncated from 9015 bytes\) \.\.\.\né/);
    assert.ok(cut.endsWith("\nError: the end"));
    assert.ok(!cut.includes("\uFFFD"));
    assert.equal(truncateTraceback("short"), "short");

    const inner = new Error("inner");
    const outer = new Error("outer", { cause: inner });
    (inner as { cause?: unknown }).cause = outer; // a cycle of causes ends
    assert.equal(tracebackOf(outer), `${outer.stack}\nCaused by: ${inner.stack}`);
    assert.equal(tracebackOf("a string"), "");
  });
});
