// A worker's handler slots. A type's concurrency is per worker, across every node it claims
// from: a job holds its type's count from its claim until its handler really ended (a handler
// that ignores its AbortSignal keeps its slot until its promise settles). A job claimed while
// every slot is taken (two nodes answered at once) waits for one, its lease kept meanwhile; so
// does a job whose previous attempt in this worker has not ended: never two attempts at once.

export class Run {
  hasSlot = false;
  granted: (() => void) | undefined;
  private endedResolve!: () => void;
  /** Settles once this attempt (and every earlier one in this worker) really ended. */
  readonly ended: Promise<void> = new Promise((r) => (this.endedResolve = r));

  constructor(
    readonly jobId: string,
    readonly type: string,
    readonly previous: Promise<void> | undefined,
  ) {}

  markEnded(): void {
    this.endedResolve();
  }
}

interface TypeSlots {
  limit: number;
  held: number;
  running: number;
  asked: number;
  queue: Run[];
  freed: Array<() => void>;
}

export class Slots {
  private readonly types = new Map<string, TypeSlots>();
  private readonly latest = new Map<string, Run>();

  define(type: string, limit: number): void {
    this.types.set(type, { limit, held: 0, running: 0, asked: 0, queue: [], freed: [] });
  }

  private of(type: string): TypeSlots {
    const t = this.types.get(type);
    if (!t) throw new Error(`no handler for job type ${type}`);
    return t;
  }

  /** Slots neither running nor promised to a job claimed already. */
  free(type: string): number {
    const t = this.of(type);
    return t.limit - t.held;
  }

  /** How many jobs one more claim may ask for: the free slots that claims in flight to other
   * nodes have not asked for, and at least one while any is free, so no node waits for another
   * node's long poll. A busy type asks again once a quarter of its slots are free (batches). */
  toAsk(type: string): number {
    const t = this.of(type);
    const free = t.limit - t.held;
    if (free <= 0 || (free < t.limit && free < Math.max(1, Math.floor(t.limit / 4)))) return 0;
    return Math.max(1, free - t.asked);
  }

  asking(type: string, n: number): void {
    this.of(type).asked += n;
  }

  /** Resolves when a job of `type` ends (or `signal` aborts); check `toAsk` again after. */
  waitFreed(type: string, signal: AbortSignal): Promise<void> {
    const t = this.of(type);
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = (): void => {
        signal.removeEventListener("abort", done);
        resolve();
      };
      t.freed.push(done);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  claimed(jobId: string, type: string): Run {
    const run = new Run(jobId, type, this.latest.get(jobId)?.ended);
    this.latest.set(jobId, run);
    this.of(type).held += 1;
    return run;
  }

  /** Wait for the job's previous attempt here to end and for a slot of its type; returns
   * without one (`run.hasSlot` false) once `signal` aborts (the lease is over). */
  async acquire(run: Run, signal: AbortSignal): Promise<void> {
    if (signal.aborted) return;
    const withdraw = (): void => this.withdraw(run);
    signal.addEventListener("abort", withdraw, { once: true });
    try {
      if (run.previous) await Promise.race([run.previous, aborted(signal)]);
      if (!signal.aborted) await this.take(run);
    } finally {
      signal.removeEventListener("abort", withdraw);
    }
  }

  private async take(run: Run): Promise<void> {
    const t = this.of(run.type);
    if (t.queue.length === 0 && t.running < t.limit) {
      t.running += 1;
      run.hasSlot = true;
      return;
    }
    await new Promise<void>((resolve) => {
      run.granted = resolve;
      t.queue.push(run);
    });
  }

  private withdraw(run: Run): void {
    const t = this.of(run.type);
    const i = t.queue.indexOf(run);
    if (i >= 0) t.queue.splice(i, 1);
    run.granted?.();
  }

  /** The run's handler really ended, or it never started: its slot goes to the next waiting. */
  ended(run: Run): void {
    const t = this.of(run.type);
    t.held -= 1;
    if (run.hasSlot) {
      t.running -= 1;
      while (t.queue.length > 0 && t.running < t.limit) {
        const next = t.queue.shift()!;
        t.running += 1;
        next.hasSlot = true;
        next.granted?.();
      }
    }
    if (this.latest.get(run.jobId) === run) this.latest.delete(run.jobId);
    run.markEnded();
    for (const wake of t.freed.splice(0)) wake();
  }

  /** Handlers running now, per type (for tests and metrics). */
  running(type: string): number {
    return this.of(type).running;
  }
}

function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}
