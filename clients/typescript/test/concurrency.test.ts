// Conformance C8: a type's concurrency limit holds in one worker across every node it polls.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Client, JobState, Worker } from "../src/index.js";
import { eventually, startServer, type TestServer } from "./helpers.js";

let servers: TestServer[];
let clients: Client[];

before(async () => {
  servers = await Promise.all([startServer(), startServer()]);
  clients = servers.map((s) => new Client({ servers: [s.address], tlsDir: false, token: "" }));
});

after(async () => {
  for (const c of clients) c.close();
  await Promise.all(servers.map((s) => s.stop()));
});

describe("C8 per-type concurrency", () => {
  it("never runs more handlers of a type at once than its limit, across both nodes", async () => {
    const LIMIT = 3;
    let running = 0;
    let most = 0;
    const ranOn = new Set<string>();
    const worker = new Worker({ servers: servers.map((s) => s.address), tlsDir: false, token: "", leaseMs: 10_000 });
    worker.handle(
      "c8.limited",
      async (ctx) => {
        running += 1;
        most = Math.max(most, running);
        ranOn.add(ctx.payload.toString());
        await new Promise((r) => setTimeout(r, 100));
        running -= 1;
      },
      { concurrency: LIMIT },
    );
    // Another type's slots are its own.
    worker.handle("c8.other", async () => undefined, { concurrency: 1 });
    const ids: Array<{ client: Client; jobId: string }> = [];
    for (const [i, client] of clients.entries()) {
      const made = await client.scheduleMany(
        Array.from({ length: 15 }, () => ({ type: "c8.limited", payload: `node${i}` })),
      );
      ids.push(...made.map((m) => ({ client, jobId: m.job.jobId })));
    }
    const running$ = worker.run();
    try {
      await eventually(
        async () => {
          for (const { client, jobId } of ids) {
            if ((await client.get(jobId)).state !== JobState.JOB_STATE_SUCCEEDED) return false;
          }
          return true;
        },
        "all 30 jobs to succeed",
        60_000,
      );
      assert.ok(most <= LIMIT, `${most} handlers ran at once, over the limit of ${LIMIT}`);
      assert.equal(most, LIMIT, "the limit was never reached: the test shows nothing");
      assert.deepEqual([...ranOn].sort(), ["node0", "node1"]);
    } finally {
      worker.stop(0);
      await running$;
    }
  });
});
