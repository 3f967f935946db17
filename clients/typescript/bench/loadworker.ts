// The TypeScript no-op worker of `tools/loadtest.py`: for each run of `loadtest.noop` it appends
// `<job_id> <run_at> <start_ms>` to $TIMESHARD_RECORD (run_at in epoch ms as the job carries it,
// start_ms the handler's wall-clock start with 3 decimals), buffered and written out every
// 0.2 s and at exit. $TIMESHARD_SERVER names the nodes, $TIMESHARD_CONCURRENCY the handlers
// (default 512).
//
//   npm run build:bench && node build/bench/loadworker.js
import { closeSync, openSync, writeSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Worker } from "../src/index.js";

const FLUSH_MS = 200;
const record = process.env.TIMESHARD_RECORD;
if (!record) {
  console.error("loadworker: set TIMESHARD_RECORD to the file to append runs to");
  process.exit(2);
}
const concurrency = Number(process.env.TIMESHARD_CONCURRENCY ?? "512");
if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000) {
  console.error("loadworker: TIMESHARD_CONCURRENCY must be an integer from 1 to 1000");
  process.exit(2);
}

const out = openSync(record, "a");
let lines: string[] = [];
function flush(): void {
  if (lines.length === 0) return;
  writeSync(out, lines.join(""));
  lines = [];
}
const flusher = setInterval(flush, FLUSH_MS);

const worker = new Worker({ leaseMs: 60_000, claimWaitMs: 5000 });
worker.handle(
  "loadtest.noop",
  async (ctx) => {
    const startMs = performance.timeOrigin + performance.now();
    lines.push(`${ctx.jobId} ${ctx.runAt} ${startMs.toFixed(3)}\n`);
  },
  { concurrency },
);
for (const sig of ["SIGTERM", "SIGINT"] as const) process.on(sig, () => worker.stop(5000));
await worker.run();
clearInterval(flusher);
flush();
closeSync(out);
