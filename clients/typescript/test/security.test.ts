// Conformance C7: TLS and mutual TLS with bearer tokens (`timeshard certs init`, `timeshard tokens
// add`), read from TIMESHARD_TLS_DIR and TIMESHARD_TOKEN as the Python SDK reads them.
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  Client,
  JobState,
  PermissionDeniedError,
  UnauthenticatedError,
  UnavailableError,
  Worker,
} from "../src/index.js";
import { cli, eventually, startServer, tempDir, type TestServer } from "./helpers.js";

let dir: string;
let tokens: { client: string; worker: string };
let tls: TestServer;
let mtls: TestServer;

function addToken(name: string, role: string): string {
  const out = cli(["tokens", "add", name, "--role", role, "--file", "auth.toml"], dir);
  return out.trim().split("\n").at(-1)!.trim();
}

before(async () => {
  dir = tempDir();
  cli(["certs", "init", "tls", "--hosts", "localhost,127.0.0.1"], dir);
  tokens = { client: addToken("app", "client"), worker: addToken("workers", "worker") };
  const auth = ["--tls-dir", join(dir, "tls"), "--auth-file", join(dir, "auth.toml")];
  tls = await startServer({ dir, args: auth });
  mtls = await startServer({ dir, args: [...auth, "--mtls"] });
});

after(async () => {
  await tls?.stop();
  await mtls?.stop();
});

/** A client configured only by the environment, as a deployed program would be. */
async function withEnv<T>(env: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const saved = { ...process.env };
  for (const k of Object.keys(process.env)) if (k.startsWith("TIMESHARD_")) delete process.env[k];
  Object.assign(process.env, env);
  try {
    return await fn();
  } finally {
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  }
}

async function listWith(server: TestServer, env: Record<string, string>): Promise<unknown> {
  return withEnv({ TIMESHARD_SERVER: server.address, ...env }, async () => {
    const client = new Client({ timeoutMs: 5000 });
    try {
      return await client.list();
    } finally {
      client.close();
    }
  });
}

for (const mode of ["TLS", "mutual TLS"] as const) {
  describe(`C7 ${mode} with a bearer token`, () => {
    const server = (): TestServer => (mode === "TLS" ? tls : mtls);
    const tlsDir = (): string => join(dir, "tls");

    it("refuses a call without a token or with a wrong one", async () => {
      await assert.rejects(listWith(server(), { TIMESHARD_TLS_DIR: tlsDir() }), UnauthenticatedError);
      await assert.rejects(
        listWith(server(), { TIMESHARD_TLS_DIR: tlsDir(), TIMESHARD_TOKEN: "ts_not-a-real-token" }),
        UnauthenticatedError,
      );
      await assert.rejects(
        listWith(server(), { TIMESHARD_TLS_DIR: tlsDir(), TIMESHARD_TOKEN: tokens.worker }),
        PermissionDeniedError,
      );
    });

    it("refuses plaintext", async () => {
      await assert.rejects(listWith(server(), { TIMESHARD_TOKEN: tokens.client }), UnavailableError);
    });

    it("accepts the right token: a client schedules and a worker runs the job", async () => {
      const env = { TIMESHARD_SERVER: server().address, TIMESHARD_TLS_DIR: tlsDir() };
      await withEnv({ ...env, TIMESHARD_TOKEN: tokens.client }, async () => {
        const client = new Client();
        const worker = await withEnv({ ...env, TIMESHARD_TOKEN: tokens.worker }, async () => {
          const w = new Worker({ leaseMs: 5000 });
          w.handle("c7.secure", async () => undefined);
          return { w, running: w.run() };
        });
        try {
          const { job } = await client.schedule("c7.secure", {});
          await eventually(async () => (await client.get(job.jobId)).state === JobState.JOB_STATE_SUCCEEDED, "the job");
        } finally {
          worker.w.stop(0);
          await worker.running;
          client.close();
        }
      });
    });
  });
}

describe("C7 mutual TLS without a client certificate", () => {
  it("is refused in the handshake", async () => {
    const bare = join(dir, "ca-only");
    mkdirSync(bare, { recursive: true });
    copyFileSync(join(dir, "tls", "ca.pem"), join(bare, "ca.pem"));
    await assert.rejects(listWith(mtls, { TIMESHARD_TLS_DIR: bare, TIMESHARD_TOKEN: tokens.client }), UnavailableError);
    assert.ok(await listWith(tls, { TIMESHARD_TLS_DIR: bare, TIMESHARD_TOKEN: tokens.client }));
  });
});
