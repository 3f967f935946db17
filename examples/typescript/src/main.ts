// Schedule a job from TypeScript, run it in a TypeScript worker, print its lateness.
//
//   timeshard dev --port 50051 &          # or any cluster: TIMESHARD_SERVER=host:port,...
//   (cd ../../clients/typescript && npm ci && npm run build)
//   npm install && npm run build && npm start
//
// TIMESHARD_SERVER, TIMESHARD_TLS_DIR and TIMESHARD_TOKEN are read as by every SDK.
import { Client, JobState, Worker } from "@timeshard/client";

const client = new Client();
const worker = new Worker();
const ran = new Promise<number>((resolve) => {
  worker.handle(
    "example.greet",
    async (ctx) => {
      console.log(`hello ${ctx.payload} (job ${ctx.jobId}, attempt ${ctx.attempt}, fence ${ctx.fence})`);
      resolve(ctx.startedAt - ctx.runAt);
    },
    { concurrency: 4 },
  );
});
const running = worker.run();

try {
  const { job } = await client.schedule("example.greet", { payload: '"from TypeScript"', delayMs: 1000 });
  console.log(`scheduled ${job.jobId}, due at ${job.runAt?.toISOString()}`);
  const lateness = await Promise.race([
    ran,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error("the job did not run within a minute: is a node serving?")), 60_000).unref(),
    ),
  ]);
  console.log(`lateness: ${lateness} ms`);
  worker.stop();
  await running;
  console.log(`state: ${JobState[(await client.get(job.jobId)).state]}`);
} catch (err) {
  console.error(`example: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
  worker.stop(0);
  await running;
} finally {
  client.close();
}
