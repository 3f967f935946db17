// A claimed job's lease as this worker sees it: a deadline on the monotonic clock
// (`performance.now()`), the server's lease minus the safety margin measured from when the claim
// or the last granted heartbeat was sent. The job's AbortSignal aborts at that deadline unless a
// heartbeat moved it on, and at once when the server refuses a heartbeat (the job was cancelled
// or claimed by another worker) or the worker shuts down.
import { performance } from "node:perf_hooks";

export const now = (): number => performance.now();

/** Why a handler's signal aborted: `ctx.signal.reason` is one of these. */
export class LeaseLostError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "LeaseLostError";
  }
}

export class Lease {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private deadline: number;
  /** The server said this worker no longer holds the job (a stale fence, cancelled, gone). */
  lost = false;

  constructor(deadline: number) {
    this.deadline = deadline;
    this.arm();
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get deadlineAt(): number {
    return this.deadline;
  }

  remaining(): number {
    return this.deadline - now();
  }

  /** Still this worker's to run and report on: not lost and the deadline not passed, now. The
   * clock is read at each call, so a process paused past the deadline sees it on waking. */
  held(): boolean {
    if (this.lost || now() >= this.deadline) {
      this.abort("the lease deadline passed (not extended in time)");
      return false;
    }
    return true;
  }

  /** A heartbeat was granted: the deadline moves on (never back). */
  extend(deadline: number): void {
    if (deadline > this.deadline) {
      this.deadline = deadline;
      this.arm();
    }
  }

  lose(reason: string): void {
    this.lost = true;
    this.abort(reason);
  }

  abort(reason: string): void {
    if (!this.controller.signal.aborted) this.controller.abort(new LeaseLostError(reason));
    this.dispose();
  }

  dispose(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private arm(): void {
    if (this.controller.signal.aborted) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    // Timers fire late, never early: the timer is set ahead of the deadline by a little so the
    // abort lands before it even on a busy event loop; `held()` re-reads the clock anyway.
    const wait = Math.max(0, this.deadline - now() - 5);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (now() >= this.deadline - 5) this.abort("the lease deadline passed (not extended in time)");
      else this.arm();
    }, wait);
    this.timer.unref();
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, Math.max(0, ms));
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
