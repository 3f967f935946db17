// The running side of the mixed example: a TypeScript worker for the `mixed.greet` jobs a Go
// client (../schedule) schedules. Prints each job and its lateness; SIGINT or SIGTERM stops it
// gracefully (a second one ends the drain at once).
import { PermanentError, Worker } from "@timeshard/client";

const worker = new Worker();
worker.handle(
  "mixed.greet",
  async (ctx) => {
    let body: { from?: string; n?: number };
    try {
      body = JSON.parse(ctx.payload.toString());
    } catch {
      throw new PermanentError("the payload is not JSON");
    }
    console.log(`job ${ctx.jobId}: hello from ${body.from} #${body.n}, lateness ${ctx.startedAt - ctx.runAt} ms`);
  },
  { concurrency: 8 },
);
for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => worker.stop());
console.log(`worker ${worker.workerId}: running mixed.greet (^C to stop)`);
await worker.run();
