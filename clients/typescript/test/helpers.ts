// Real timeshard servers for the conformance tests: `timeshard server` on the embedded store,
// started as a subprocess (python3 -m timeshard.cli.main, or $TIMESHARD_PYTHON), on a free port,
// from this checkout's Python sources (../../src), not whichever timeshard the interpreter has
// installed: a test run in a worktree tests that worktree's server.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";

const PYTHON = process.env.TIMESHARD_PYTHON ?? "python3";
const CLI = ["-m", "timeshard.cli.main"];
/** The checkout's src/ (this file runs from clients/typescript/build/test/). */
const SOURCES = fileURLToPath(new URL("../../../../src", import.meta.url));

/** The environment without TIMESHARD_* (tests set what they mean), with the checkout's
 * sources first on PYTHONPATH. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("TIMESHARD_")) env[k] = v;
  if (existsSync(join(SOURCES, "timeshard"))) {
    env.PYTHONPATH = [SOURCES, ...(env.PYTHONPATH ? [env.PYTHONPATH] : [])].join(delimiter);
  }
  return { ...env, ...extra };
}

export function tempDir(): string {
  return mkdtempSync(join(tmpdir(), "timeshard-ts-"));
}

/** Run the timeshard CLI to completion; its stdout. */
export function cli(args: string[], cwd: string, env: Record<string, string> = {}): string {
  const out = spawnSync(PYTHON, [...CLI, ...args], { cwd, env: cleanEnv(env), encoding: "utf8" });
  if (out.status !== 0) throw new Error(`timeshard ${args.join(" ")}: ${out.stderr}`);
  return out.stdout;
}

const children = new Set<ChildProcess>();
// A runner that dies (a failed assertion, ^C) takes its servers with it.
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

export interface TestServer {
  address: string;
  dir: string;
  process: ChildProcess;
  stop(): Promise<void>;
}

export interface ServerOptions {
  /** Per-type policies (--types). */
  types?: Record<string, Record<string, number>>;
  args?: string[];
  dir?: string;
}

export async function startServer(opts: ServerOptions = {}): Promise<TestServer> {
  const dir = opts.dir ?? tempDir();
  const args = [...CLI, "server", "--port", "0", "--shards", "8", "--retry-base", "0.2"];
  args.push("--store", `sqlite://${join(dir, `ts-${Date.now()}-${Math.random().toString(36).slice(2)}.db`)}`);
  if (opts.types) {
    writeFileSync(join(dir, "types.json"), JSON.stringify(opts.types));
    args.push("--types", join(dir, "types.json"));
  }
  args.push(...(opts.args ?? []));
  const child = spawn(PYTHON, args, { cwd: dir, env: cleanEnv(), stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  child.once("exit", () => children.delete(child));
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const address = await new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`server did not start: ${stderr}`)), 30_000);
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /serving on (\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}: ${stderr}`));
    });
  });
  child.stdout!.resume();
  return {
    address,
    dir,
    process: child,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await exited;
      }
      if (!opts.dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Wait until `check` holds, polling; fails after `timeoutMs` with `what`. */
export async function eventually<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  timeoutMs = 20_000,
): Promise<T> {
  const until = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface Proxy {
  address: string;
  /** A network partition: nothing passes any more, either way, and calls hang. */
  freeze(): void;
  /** Keep what the target sends from now on (answers arrive late, in order, none lost); what
   * the client sends still goes through. */
  hold(): void;
  /** Send on what was held, then everything as it comes. */
  release(): void;
  close(): void;
}

/** A TCP proxy to `target` that can be frozen (a network partition that neither answers nor
 * refuses: bytes are held, connections stay open) or can hold the target's answers a while. */
export async function startProxy(target: string): Promise<Proxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const sockets = new Set<net.Socket>();
  let frozen = false;
  let held: Array<() => void> | undefined; // while held: what to send at release
  const server = net.createServer((client) => {
    if (frozen) return; // accepted and never answered
    const upstream = net.connect(port, host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => undefined);
      s.on("close", () => sockets.delete(s));
    }
    client.pipe(upstream);
    upstream.on("data", (d: Buffer) => {
      if (held) held.push(() => client.write(d));
      else client.write(d);
    });
    upstream.on("end", () => client.end());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port: p } = server.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${p}`,
    freeze: () => {
      frozen = true;
      for (const s of sockets) {
        s.unpipe();
        s.removeAllListeners("data");
        s.pause();
      }
    },
    hold: () => {
      held ??= [];
    },
    release: () => {
      const pending = held ?? [];
      held = undefined;
      for (const send of pending) send();
    },
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

/** A port nothing listens on. */
export async function closedPort(): Promise<string> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((r) => server.close(r));
  return `127.0.0.1:${port}`;
}
