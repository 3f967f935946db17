// Results and heartbeats of running jobs, for the worker. Results go out in `Finish` batches
// (the items queued for a node in one turn of the event loop), each item retried on the job's
// node first and then on the others, with backoff, while the lease is held; heartbeats go to
// the job's node, and to the next one as well when it has not answered within half the time
// left. Once the lease is over nothing is sent: the job is another worker's to run.
import { status, type Metadata } from "@grpc/grpc-js";
import type { FinishItem, FinishResult, HeartbeatRequest } from "./gen/timeshard/v1/timeshard.js";
import { NodeConnection, unary } from "./connection.js";
import { TimeshardError } from "./errors.js";
import { Lease, now, sleep } from "./lease.js";
import { durationOf, msOf } from "./time.js";

const RETRY_CODES = new Set([status.UNAVAILABLE, status.DEADLINE_EXCEEDED, status.ABORTED]);
/** A heartbeat refused: the lease is not this worker's any more. */
const REFUSED = new Set([status.FAILED_PRECONDITION, status.NOT_FOUND]);
const MAX_BATCH = 1000;

interface Pending {
  item: FinishItem;
  resolve: (r: FinishResult) => void;
  reject: (e: unknown) => void;
}

class NodeBatch {
  private queue: Pending[] = [];
  private scheduled = false;

  constructor(
    private readonly node: NodeConnection,
    private readonly metadata: Metadata,
  ) {}

  send(item: FinishItem): Promise<FinishResult> {
    return new Promise((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, MAX_BATCH);
      const request = { items: batch.map((p) => p.item) };
      unary(this.node.worker.finish.bind(this.node.worker), request, this.metadata, {
        timeoutMs: 10_000,
      }).then(
        (res) => {
          const byId = new Map(res.results.map((r) => [r.jobId, r]));
          for (const p of batch) {
            const r = byId.get(p.item.jobId);
            if (r) p.resolve(r);
            else p.reject(new TimeshardError(status.INTERNAL, "no result for the job in Finish"));
          }
        },
        (err) => {
          for (const p of batch) p.reject(err);
        },
      );
    }
  }
}

export type Targets = () => NodeConnection[];

/** A job's handler start, as its heartbeats tell the node: the first heartbeat after the start
 * is the start notice (the node counts the attempt from it), sent at once; every later one says
 * `started` too, so whichever arrives is the notice. */
export class StartNotice {
  /** When the handler started (wall clock); undefined until it does. */
  at: Date | undefined;
  /** A notice is owed: the next heartbeat goes at once. */
  due = false;
  private wake: (() => void) | undefined;

  /** The handler starts now. */
  started(at: Date): void {
    this.at = at;
    this.due = true;
    this.wake?.();
  }

  /** Resolves after `ms`, when the handler starts, or when `done` aborts. */
  sleep(ms: number, done: AbortSignal): Promise<void> {
    if (this.due || done.aborted) return Promise.resolve();
    const woken = new AbortController();
    const wake = (): void => woken.abort();
    this.wake = wake;
    done.addEventListener("abort", wake, { once: true });
    return sleep(ms, woken.signal).finally(() => {
      this.wake = undefined;
      done.removeEventListener("abort", wake);
    });
  }
}

export class Results {
  private readonly batches = new Map<string, NodeBatch>();

  constructor(private readonly metadata: Metadata) {}

  private batch(node: NodeConnection): NodeBatch {
    let b = this.batches.get(node.address);
    if (!b) {
      b = new NodeBatch(node, this.metadata);
      this.batches.set(node.address, b);
    }
    return b;
  }

  /** Send one result until it is in (its FinishResult, whatever its code) or the lease is over
   * (null, and why). `targets()` lists the job's node first. */
  async deliver(
    item: FinishItem,
    targets: Targets,
    lease: Lease,
  ): Promise<{ result: FinishResult | null; why: string }> {
    let backoff = 100;
    let why = "the lease ended before the result was in";
    for (let attempt = 0; lease.held(); attempt++) {
      const nodes = targets();
      const node = nodes[attempt % nodes.length]!;
      try {
        const result = await this.batch(node).send(item);
        if (!RETRY_CODES.has(result.code)) return { result, why: "" };
        why = `${status[result.code]}: ${result.message}`;
      } catch (err) {
        if (!(err instanceof TimeshardError) || !RETRY_CODES.has(err.code)) {
          return { result: null, why: `Finish refused: ${String(err)}` };
        }
        why = err.message;
      }
      await sleep(Math.min(backoff, Math.max(0, lease.remaining())));
      backoff = Math.min(2000, backoff * 2);
    }
    return { result: null, why };
  }

  /** Give back a job whose handler never started (`item` has `giveBack` and `notStarted`): sent
   * whatever the lease's state (no handler ran, so no one can act twice; the fence keeps it from
   * touching a later delivery), tried at least once and retried on `UNAVAILABLE` and the like
   * until `leaseEnd` (the earliest the node's lease can end: it then gives the job back itself,
   * uncounted). Its FinishResult, or null and why. */
  async giveBackUnstarted(
    item: FinishItem,
    targets: Targets,
    leaseEnd: number,
  ): Promise<{ result: FinishResult | null; why: string }> {
    let backoff = 50;
    for (let attempt = 0; ; attempt++) {
      const nodes = targets();
      const node = nodes[attempt % nodes.length]!;
      let why: string;
      try {
        const result = await this.batch(node).send(item);
        if (!RETRY_CODES.has(result.code)) return { result, why: "" };
        why = `${status[result.code]}: ${result.message}`;
      } catch (err) {
        if (!(err instanceof TimeshardError) || !RETRY_CODES.has(err.code)) {
          return { result: null, why: `Finish refused: ${String(err)}` };
        }
        why = err.message;
      }
      if (now() + backoff >= leaseEnd) return { result: null, why };
      await sleep(backoff);
      backoff = Math.min(2000, backoff * 2);
    }
  }

  /** The heartbeat loop of one job until `done` aborts: every third of the lease from
   * `firstAt`, and at once when the handler starts (`notice`: that heartbeat is the start
   * notice, and every later one says started too); a granted one moves the lease on; a refusal
   * loses it. */
  async heartbeats(opts: {
    jobId: string;
    fence: number;
    leaseMs: number;
    marginMs: number;
    lease: Lease;
    targets: Targets;
    firstAt: number;
    notice: StartNotice;
    done: AbortSignal;
  }): Promise<void> {
    const { lease, leaseMs, marginMs, notice, done } = opts;
    const every = leaseMs / 3;
    let next = opts.firstAt;
    let failures = 0;
    while (!done.aborted && lease.held()) {
      await notice.sleep(Math.min(next, lease.deadlineAt) - now(), done);
      if (done.aborted || !lease.held() || (now() < next && !notice.due)) continue;
      // A notice owed goes now, once: if it fails, the next try comes with the retries below
      // (every later heartbeat says started), not in a loop.
      notice.due = false;
      const request: HeartbeatRequest = {
        jobId: opts.jobId,
        fence: opts.fence,
        lease: durationOf(leaseMs),
        started: notice.at !== undefined,
        startedAt: notice.at,
      };
      const sent = now();
      try {
        const res = await this.heartbeat(request, opts.targets(), failures, lease);
        lease.extend(sent + msOf(res.lease) - marginMs);
        failures = 0;
        next = sent + every;
      } catch (err) {
        if (err instanceof TimeshardError && REFUSED.has(err.code)) {
          lease.lose(`the job is no longer this worker's (${err.message})`);
          return;
        }
        failures += 1;
        next = now() + Math.min(1000, every);
      }
    }
  }

  private heartbeat(
    request: HeartbeatRequest,
    nodes: NodeConnection[],
    first: number,
    lease: Lease,
  ): Promise<{ lease: ReturnType<typeof durationOf> | undefined }> {
    return new Promise((resolve, reject) => {
      const cancel = new AbortController();
      let asked = 0;
      let pending = 0;
      let settled = false;
      let timer: NodeJS.Timeout | undefined;
      let lastError: unknown;
      const finish = (fn: () => void): void => {
        if (settled) return;
        settled = true;
        if (timer) clearTimeout(timer);
        cancel.abort();
        fn();
      };
      const askNext = (): void => {
        if (settled || asked >= nodes.length) return;
        const node = nodes[(first + asked) % nodes.length]!;
        asked += 1;
        pending += 1;
        const left = Math.max(100, lease.remaining());
        if (asked < nodes.length) timer = setTimeout(askNext, left / 2);
        unary(node.worker.heartbeat.bind(node.worker), request, this.metadata, {
          timeoutMs: left,
          signal: cancel.signal,
        }).then(
          (res) => finish(() => resolve(res)),
          (err) => {
            pending -= 1;
            if (err instanceof TimeshardError && REFUSED.has(err.code)) {
              return finish(() => reject(err));
            }
            lastError = err;
            if (timer) clearTimeout(timer);
            if (asked < nodes.length) askNext();
            else if (pending === 0) finish(() => reject(lastError));
          },
        );
      };
      askNext();
    });
  }
}
