// The worker: async handlers per job type, run under the unary worker protocol of
// docs/architecture.md ("The worker protocol"): discover the nodes (ClusterInfo), long-poll
// Claim on each for each type's free slots, heartbeat every third of the lease, report in
// Finish batches, and on stop drain for a bounded time, then give back what was stopped.
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { status, type Metadata } from "@grpc/grpc-js";
import type { ClaimedJob, FinishItem } from "./gen/timeshard/v1/timeshard.js";
import { type ConnectOptions, type Security, resolveSecurity, resolveServers } from "./config.js";
import { MAX_REPLY_BYTES, NodeConnection, unary } from "./connection.js";
import { ConfigError, PermanentError } from "./errors.js";
import { Lease, LeaseLostError, now, sleep } from "./lease.js";
import { Results, StartNotice } from "./results.js";
import { type EncodedResult, ResultError, encodeResult, tracebackOf } from "./returns.js";
import { Slots, type Run } from "./slots.js";
import { durationOf, epochMs, msOf } from "./time.js";

/** What a handler is handed for one attempt of one job. */
export interface JobContext {
  readonly jobId: string;
  readonly type: string;
  readonly payload: Buffer;
  /** This attempt, from 1. */
  readonly attempt: number;
  readonly maxAttempts: number;
  /** The lease's token: pass it to external systems that must refuse a stale writer. */
  readonly fence: number;
  readonly idempotencyKey: string;
  /** When the job was due, epoch ms. */
  readonly runAt: number;
  /** When the handler started, epoch ms (wall clock): its lateness is `startedAt - runAt`. */
  readonly startedAt: number;
  readonly workerId: string;
  /** Aborts before the lease deadline when the lease could not be extended, when the job was
   * cancelled or claimed by another worker, and when the worker shuts down. Its `reason` is a
   * `LeaseLostError`. A handler must stop promptly once it aborts: its result is not sent. */
  readonly signal: AbortSignal;
  /** Throws the signal's reason if it aborted or the lease deadline has passed (reads the
   * clock now, so a process paused past its lease learns it before its next step). */
  check(): void;
}

/** A job type's handler. What it returns is the job's result (`undefined` or `null`: none; a
 * `Uint8Array`: those bytes; anything else: its JSON); what it throws fails the attempt. */
export type Handler = (ctx: JobContext) => Promise<unknown>;

export interface HandlerOptions {
  /** Handlers of this type running at once in this worker, across every node (default 10). */
  concurrency?: number;
}

/** "not started": a claimed job this worker did not start (its lease over, or too short to run,
 * when the claim's answer was read; the worker stopping; its lease over while it waited for a
 * slot) was given back unstarted, its attempt not counted; the detail says why. */
export type WorkerEvent =
  | "started"
  | "succeeded"
  | "failed"
  | "lost"
  | "unreported"
  | "rejected"
  | "given back"
  | "not started";

/** Why a claimed job was given back without its handler starting (its `FinishItem.error`). */
export const NOT_STARTED = {
  late: "not started: lease over before the worker received it",
  tooClose: "not started: less than the safety margin of its lease left when the worker received it",
  stopping: "not started: the worker was stopping",
  noSlot: "not started: its lease ran out while it waited for a slot",
} as const;

export interface WorkerOptions extends ConnectOptions {
  workerId?: string;
  /** The lease asked for each job (default 30 s). */
  leaseMs?: number;
  /** How long before the lease's end a handler is stopped (default a sixth of the lease; less
   * than half of it). A job whose claim answer leaves less than this before that deadline is not
   * started but given back ("not started"). */
  safetyMarginMs?: number;
  /** The longest a Claim long poll waits (default 20 s; at most half of lease - margin, and no
   * more than leaves the margin before the deadline). */
  claimWaitMs?: number;
  /** How often the node list is asked again (default 5 s). */
  discoverEveryMs?: number;
  /** Ask the nodes for the cluster's node list (default true); false polls only `servers`
   * (nodes reached through a proxy that their advertised addresses do not name). */
  discover?: boolean;
  /** How long `stop()` lets running handlers finish (default 30 s). */
  drainMs?: number;
  /** Told of each job's progress (a hook that throws is ignored). */
  onEvent?: (event: WorkerEvent, ctx: JobContext, detail: string) => void;
  /** Where the worker's warnings go (default console.warn). */
  warn?: (message: string) => void;
}

/** How long a handler stopped at shutdown has to end before its job is left to its lease. */
export const STOP_GRACE_MS = 2000;

interface HandlerSpec {
  fn: Handler;
  concurrency: number;
}

interface InFlight {
  ctx: JobContext;
  lease: Lease;
  leaseEnd: number;
  notice: StartNotice;
  run: Run;
  settled: boolean;
  stopped: boolean;
  abandoned: boolean;
  done: Promise<void>;
}

/** How an attempt ended, as its `Finish` item says it. */
interface Ended {
  kind: "complete" | "retry" | "permanent" | "give back";
  error: string;
  /** A failure's: the stack of what the handler threw. */
  traceback?: string;
  /** A completion's. */
  result?: EncodedResult;
}

const GIVE_BACK: Ended = { kind: "give back", error: "worker shut down" };

interface Polled {
  node: NodeConnection;
  stop: AbortController;
}

export class Worker {
  readonly workerId: string;
  readonly leaseMs: number;
  readonly safetyMarginMs: number;
  private readonly claimWaitMs: number;
  private readonly discoverEveryMs: number;
  private drainMs: number;
  private readonly handlers = new Map<string, HandlerSpec>();
  private readonly slots = new Slots();
  private readonly options: WorkerOptions;
  private readonly warn: (message: string) => void;
  private security: Security | undefined;
  private results: Results | undefined;
  private metadata: Metadata | undefined;
  private readonly connections = new Map<string, NodeConnection>();
  private readonly polled = new Map<string, Polled>();
  private readonly inflight = new Map<JobContext, InFlight>();
  private readonly loops = new Set<Promise<void>>();
  /** Give-backs of jobs not started, in flight (the shutdown waits for them). */
  private readonly givingBack = new Set<Promise<void>>();
  private stopping = new AbortController();
  private drainOver = new AbortController();
  private stopped: Promise<void> | undefined;
  private running = false;
  /** Handlers that did not end within the stop grace: their jobs were left to the lease. */
  abandoned = 0;

  constructor(opts: WorkerOptions = {}) {
    this.options = opts;
    this.workerId = opts.workerId ?? `ts-${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
    this.leaseMs = opts.leaseMs ?? 30_000;
    this.safetyMarginMs = opts.safetyMarginMs ?? this.leaseMs / 6;
    if (!(this.safetyMarginMs > 0 && this.safetyMarginMs < this.leaseMs / 2)) {
      // A job received with less than the margin before its deadline (lease - margin) is given
      // back unstarted: with a margin of half the lease or more none could ever run.
      throw new ConfigError("need 0 < safetyMarginMs < leaseMs / 2");
    }
    if (this.leaseMs < 1000) throw new ConfigError("leaseMs must be at least 1000 (the server's least)");
    // A claim answered at the end of its wait still has time: half of what the lease leaves
    // after its margin, and the margin before the deadline (else it would be too close to run).
    const m = this.safetyMarginMs;
    this.claimWaitMs = Math.max(100, Math.min(opts.claimWaitMs ?? 20_000, (this.leaseMs - m) / 2, this.leaseMs - 2 * m));
    this.discoverEveryMs = opts.discoverEveryMs ?? 5000;
    this.drainMs = opts.drainMs ?? 30_000;
    this.warn = opts.warn ?? ((m) => console.warn(`timeshard worker: ${m}`));
  }

  /** Register the handler of a job type (before `run`). */
  handle(type: string, fn: Handler, opts: HandlerOptions = {}): this {
    if (this.running) throw new ConfigError("register handlers before run()");
    if (this.handlers.has(type)) throw new ConfigError(`a handler for ${type} is already registered`);
    const concurrency = opts.concurrency ?? 10;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000) {
      throw new ConfigError(`concurrency of ${type} must be an integer from 1 to 1000`);
    }
    this.handlers.set(type, { fn, concurrency });
    this.slots.define(type, concurrency);
    return this;
  }

  /** Handlers of `type` running now. */
  runningCount(type: string): number {
    return this.slots.running(type);
  }

  /** Claim and run jobs until `stop()`; resolves once stopped (drained, jobs given back). */
  async run(): Promise<void> {
    if (this.running) throw new ConfigError("this worker is already running");
    if (this.handlers.size === 0) throw new ConfigError("register a handler before run()");
    this.running = true;
    this.security = resolveSecurity(this.options);
    this.metadata = this.security.metadata;
    this.results = new Results(this.metadata);
    const seeds = resolveServers(this.options.servers);
    for (const a of seeds) this.connection(a);
    await this.discoverLoop(seeds);
    await (this.stopped ??= this.shutdown());
  }

  /** Stop gracefully; `run()` resolves when done. The first call stops claiming and lets the
   * running handlers finish for at most `drainMs`; a second call ends that wait at once. Then
   * each handler still running is stopped (its signal aborts) and, once it has ended, its job
   * is given back: scheduled again now and the attempt not counted. A handler that does not end
   * within STOP_GRACE_MS is not given back (it may still act): its job is left to its lease. */
  stop(drainMs?: number): void {
    if (this.stopping.signal.aborted) {
      this.drainOver.abort();
      return;
    }
    if (drainMs !== undefined) this.drainMs = drainMs;
    this.stopping.abort();
    for (const p of this.polled.values()) p.stop.abort();
  }

  private connection(address: string): NodeConnection {
    let c = this.connections.get(address);
    if (!c) {
      c = new NodeConnection(address, this.security!, MAX_REPLY_BYTES);
      this.connections.set(address, c);
    }
    return c;
  }

  // -- discovering and claiming ------------------------------------------------------------

  private async discoverLoop(seeds: string[]): Promise<void> {
    while (!this.stopping.signal.aborted) {
      const addresses = await this.discover(seeds);
      if (addresses.length > 0) this.pollOnly(addresses);
      else if (this.polled.size === 0) this.pollOnly(seeds);
      await sleep(this.discoverEveryMs, this.stopping.signal);
    }
  }

  /** Every node's address, as the nodes known that answer ClusterInfo list them ([] if none
   * answers). Every one is asked, so a worker given nodes of two clusters polls both. */
  private async discover(seeds: string[]): Promise<string[]> {
    if (this.options.discover === false) return seeds;
    const known = [...new Set([...this.polled.keys(), ...seeds])];
    const found = new Set<string>();
    for (const address of known) {
      const node = this.connection(address);
      try {
        const info = await unary(node.admin.clusterInfo.bind(node.admin), {}, this.metadata!, {
          timeoutMs: 5000,
          signal: this.stopping.signal,
        });
        for (const n of info.nodes) if (n.address) found.add(n.address);
      } catch (err) {
        if (this.stopping.signal.aborted) return [];
        if (this.polled.has(address) || seeds.includes(address)) {
          this.warn(`ClusterInfo on ${address} failed: ${String(err)}`);
        }
      }
    }
    return [...found];
  }

  private pollOnly(addresses: string[]): void {
    for (const [address, p] of this.polled) {
      if (!addresses.includes(address)) {
        p.stop.abort();
        this.polled.delete(address);
      }
    }
    for (const address of addresses) {
      if (this.polled.has(address)) continue;
      const p = { node: this.connection(address), stop: new AbortController() };
      this.polled.set(address, p);
      for (const type of this.handlers.keys()) this.track(this.claimLoop(p, type));
    }
  }

  private track(loop: Promise<void>): void {
    const tracked = loop
      .catch((err: unknown) => this.warn(`a claim loop ended on an error: ${describe(err)}`))
      .finally(() => this.loops.delete(tracked));
    this.loops.add(tracked);
  }

  /** One type's long polls to one node, asking for that type's free slots. */
  private async claimLoop(p: Polled, type: string): Promise<void> {
    let backoff = 100;
    while (!p.stop.signal.aborted) {
      const n = this.slots.toAsk(type);
      if (n <= 0) {
        await this.slots.waitFreed(type, p.stop.signal);
        continue;
      }
      const request = {
        workerId: this.workerId,
        types: [type],
        maxJobs: n,
        wait: durationOf(this.claimWaitMs),
        lease: durationOf(this.leaseMs),
        maxReplyBytes: MAX_REPLY_BYTES,
      };
      const sent = now(); // the lease of each job claimed counts from before this
      this.slots.asking(type, n);
      let jobs: ClaimedJob[];
      try {
        const res = await unary(p.node.worker.claim.bind(p.node.worker), request, this.metadata!, {
          timeoutMs: this.claimWaitMs + 10_000,
          signal: p.stop.signal,
        });
        jobs = res.jobs;
      } catch (err) {
        if (p.stop.signal.aborted) return;
        this.warn(`claim on ${p.node.address} failed: ${String(err)}; again in ${backoff} ms`);
        await sleep(backoff, p.stop.signal);
        backoff = Math.min(5000, backoff * 2);
        continue;
      } finally {
        this.slots.asking(type, -n);
      }
      backoff = 100;
      for (const claimed of jobs) this.start(p.node, claimed, sent); // (or given back: never dropped)
    }
  }

  // -- running one job ---------------------------------------------------------------------

  private targets(first: NodeConnection): () => NodeConnection[] {
    return () => [first, ...[...this.polled.values()].map((p) => p.node).filter((n) => n !== first)];
  }

  /** Run one claimed job, or give it back unstarted when this worker does not run it
   * (`whyNotStart`): then no step of its handler is taken and the job goes back to the node at
   * once, uncounted, rather than waiting out its lease. */
  private start(node: NodeConnection, claimed: ClaimedJob, sent: number): void {
    const job = claimed.job!;
    const leaseEnd = sent + msOf(claimed.lease);
    const deadline = leaseEnd - this.safetyMarginMs;
    const lease = new Lease(deadline);
    const ctx: JobContext = {
      jobId: job.jobId,
      type: job.type,
      payload: job.payload,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      fence: claimed.fence,
      idempotencyKey: claimed.idempotencyKey,
      runAt: epochMs(job.runAt),
      startedAt: 0,
      workerId: this.workerId,
      signal: lease.signal,
      check: () => {
        if (!lease.held() || lease.signal.aborted) throw lease.signal.reason;
      },
    };
    const why = this.whyNotStart(job.type, deadline);
    if (why) {
      lease.abort(why);
      const given = this.giveBackUnstarted(node, ctx, leaseEnd, why)
        .catch((err: unknown) => this.warn(`job ${ctx.jobId}: ${describe(err)}`))
        .finally(() => this.givingBack.delete(given));
      this.givingBack.add(given);
      return;
    }
    const run = this.slots.claimed(job.jobId, job.type);
    const flight: InFlight = {
      ctx,
      lease,
      leaseEnd,
      notice: new StartNotice(),
      run,
      settled: false,
      stopped: false,
      abandoned: false,
      done: Promise.resolve(),
    };
    this.inflight.set(ctx, flight);
    // A claim that waited in its long poll has used part of its lease: heartbeat at once.
    const waited = now() - sent > this.safetyMarginMs / 2;
    flight.done = this.execute(node, flight, waited ? now() : sent + this.leaseMs / 3)
      .catch((err: unknown) => this.warn(`job ${ctx.jobId}: ${describe(err)}`))
      .finally(() => this.inflight.delete(ctx));
  }

  /** Why a claimed job is not to be started ("" when it is): the worker is stopping; no handler
   * of its type here; its deadline ((claim sent) + lease - margin) passed before the answer was
   * read (the process was paused, the answer slow), or less than the margin is left before it: a
   * handler could barely start before it had to be stopped, and the job is better given to a
   * worker that has the time. */
  private whyNotStart(type: string, deadline: number): string {
    const left = deadline - now();
    if (this.stopping.signal.aborted) return NOT_STARTED.stopping;
    if (!this.handlers.has(type)) return `not started: the worker has no handler for type ${JSON.stringify(type)}`;
    if (left <= 0) return NOT_STARTED.late;
    if (left < this.safetyMarginMs) return NOT_STARTED.tooClose;
    return "";
  }

  /** Send a job whose handler never started back to the node: `give_back` and `not_started`
   * (and `failed`, for a node that predates both), fenced as any result; the node schedules it
   * again at once without counting an attempt. */
  private async giveBackUnstarted(node: NodeConnection, ctx: JobContext, leaseEnd: number, why: string): Promise<void> {
    this.warn(`job ${ctx.jobId}: given back unstarted: ${why}`);
    const item = finishItem({ jobId: ctx.jobId, fence: ctx.fence, failed: true, giveBack: true, notStarted: true, error: why });
    const { result, why: failure } = await this.results!.giveBackUnstarted(item, this.targets(node), leaseEnd);
    let detail = why;
    if (result === null) detail += `; the give-back was not taken (${failure})`;
    else if (result.code !== 0) detail += `; the give-back was not taken (${status[result.code]}: ${result.message})`;
    this.emit("not started", ctx, detail);
  }

  private async execute(node: NodeConnection, f: InFlight, firstHeartbeat: number): Promise<void> {
    const { ctx, lease, run } = f;
    const targets = this.targets(node);
    const resultIn = new AbortController();
    const heartbeats = this.results!.heartbeats({
      jobId: ctx.jobId,
      fence: ctx.fence,
      leaseMs: this.leaseMs,
      marginMs: this.safetyMarginMs,
      lease,
      targets,
      firstAt: firstHeartbeat,
      notice: f.notice,
      done: resultIn.signal,
    });
    let invoked = false;
    try {
      await this.slots.acquire(run, lease.signal);
      if (!run.hasSlot || !lease.held() || lease.signal.aborted) {
        f.settled = true; // no handler to wait for
        // Never started: given back, unless the node said the job is no longer ours.
        if (!lease.lost) {
          const why = f.stopped ? NOT_STARTED.stopping : NOT_STARTED.noSlot;
          await this.giveBackUnstarted(node, ctx, f.leaseEnd, why);
        }
        return;
      }
      invoked = true;
      const outcome = await this.invoke(f);
      if (f.abandoned) return;
      if (f.stopped && !lease.lost) {
        await this.report(f, targets, GIVE_BACK);
      } else if (lease.lost || !lease.held()) {
        this.emit("lost", ctx, `${String(lease.signal.reason?.message ?? "lease over")}; nothing reported`);
      } else {
        await this.report(f, targets, outcome);
      }
    } finally {
      resultIn.abort();
      lease.dispose();
      if (!invoked) this.slots.ended(run); // (a handler that ran gave it back on settling)
      await heartbeats;
    }
  }

  /** Call the handler; its slot is given back when its promise settles, not before. */
  private async invoke(f: InFlight): Promise<Ended> {
    const spec = this.handlers.get(f.ctx.type)!;
    const startedAt = Date.now();
    (f.ctx as { startedAt: number }).startedAt = startedAt;
    f.notice.started(new Date(startedAt)); // the start notice goes now; the handler does not wait for it
    this.emit("started", f.ctx, "");
    let value: unknown;
    try {
      value = await spec.fn(f.ctx);
    } catch (err) {
      const kind = err instanceof PermanentError ? "permanent" : "retry";
      return { kind, error: describe(err), traceback: tracebackOf(err) };
    } finally {
      f.settled = true;
      this.slots.ended(f.run);
    }
    return completed(value);
  }

  private async report(f: InFlight, targets: () => NodeConnection[], ended: Ended): Promise<void> {
    const { kind, error } = ended;
    const item = finishItem({
      jobId: f.ctx.jobId,
      fence: f.ctx.fence,
      failed: kind !== "complete",
      error: truncate(error),
      permanent: kind === "permanent",
      giveBack: kind === "give back",
      result: ended.result?.result ?? Buffer.alloc(0),
      resultEncoding: ended.result?.encoding ?? "",
      traceback: ended.traceback ?? "",
    });
    const { result, why } = await this.results!.deliver(item, targets, f.lease);
    if (result === null) this.emit("unreported", f.ctx, `${why}; the job is left to its lease expiry`);
    else if (result.code !== 0) this.emit("rejected", f.ctx, result.message);
    else this.emit(kind === "complete" ? "succeeded" : kind === "give back" ? "given back" : "failed", f.ctx, error);
  }

  private emit(event: WorkerEvent, ctx: JobContext, detail: string): void {
    if (event === "unreported" || event === "rejected" || event === "lost") {
      this.warn(`job ${ctx.jobId}: ${event}: ${detail}`);
    }
    try {
      this.options.onEvent?.(event, ctx, detail);
    } catch {
      // a hook that throws must not break the worker's own bookkeeping
    }
  }

  // -- stopping ----------------------------------------------------------------------------

  private stopHandler(f: InFlight): void {
    f.stopped = true;
    f.lease.abort("the worker is shutting down");
  }

  private async shutdown(): Promise<void> {
    await Promise.all([...this.loops]);
    const all = (): Promise<unknown> => Promise.all([...this.inflight.values()].map((f) => f.done));
    if (this.inflight.size > 0) {
      await Promise.race([all(), sleep(this.drainMs, this.drainOver.signal)]);
    }
    const left = [...this.inflight.values()];
    for (const f of left) this.stopHandler(f);
    if (left.length > 0) {
      await Promise.race([
        Promise.all(left.map((f) => waitSettled(f))),
        sleep(STOP_GRACE_MS),
      ]);
      for (const f of left) {
        if (!f.settled) {
          f.abandoned = true;
          f.lease.lose("the handler did not end when stopped; left to its lease expiry");
          this.abandoned += 1;
        }
      }
      await Promise.race([all(), sleep(STOP_GRACE_MS + 1000)]);
    }
    await Promise.all([...this.givingBack]); // (each bounded by its job's lease)
    for (const c of this.connections.values()) c.close();
  }
}

/** A handler's end with its return value: a completion with the value as the job's result, or a
 * permanent failure saying why the value can not be stored (no traceback: the handler did
 * nothing wrong where a stack would point). */
function completed(value: unknown): Ended {
  try {
    return { kind: "complete", error: "", result: encodeResult(value) };
  } catch (err) {
    if (err instanceof ResultError) return { kind: "permanent", error: describe(err) };
    throw err;
  }
}

/** A result to send: the fields given, the rest empty. */
function finishItem(fields: Partial<FinishItem> & Pick<FinishItem, "jobId" | "fence">): FinishItem {
  return {
    failed: false,
    error: "",
    permanent: false,
    giveBack: false,
    result: Buffer.alloc(0),
    resultEncoding: "",
    traceback: "",
    notStarted: false,
    ...fields,
  };
}

async function waitSettled(f: InFlight): Promise<void> {
  while (!f.settled) await sleep(10);
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}

function truncate(text: string): string {
  const b = Buffer.from(text, "utf8");
  return b.length <= 4000 ? text : b.subarray(0, 4000).toString("utf8").replace(/\uFFFD$/, "");
}

export { LeaseLostError, PermanentError };
