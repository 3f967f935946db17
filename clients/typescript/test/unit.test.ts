// No server: the lease's deadline on the monotonic clock, and the handler slots.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Lease, LeaseLostError, now } from "../src/lease.js";
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
