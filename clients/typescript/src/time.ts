// Conversions between the wire's Timestamp (a Date here) and Duration, and epoch milliseconds.
import type { Duration } from "./gen/google/protobuf/duration.js";

export function durationOf(ms: number): Duration {
  const whole = Math.floor(ms / 1000);
  return { seconds: whole, nanos: Math.round((ms - whole * 1000) * 1e6) };
}

export function msOf(d: Duration | undefined): number {
  return d ? d.seconds * 1000 + d.nanos / 1e6 : 0;
}

/** Epoch milliseconds of a wire timestamp (0 when unset). */
export function epochMs(t: Date | undefined): number {
  return t ? t.getTime() : 0;
}
