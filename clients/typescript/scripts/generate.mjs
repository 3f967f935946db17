// Generates src/gen/ from proto/timeshard/v1/*.proto with ts-proto, through protoc as
// `python -m grpc_tools.protoc` ships it (its own copy of the google/protobuf well-known types).
// `--check` generates into a temporary directory and fails on any difference from src/gen/.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const protoRoot = resolve(root, "../../proto");
const committed = join(root, "src/gen");
const plugin = join(root, "node_modules/.bin/protoc-gen-ts_proto");
const options = [
  "outputServices=grpc-js",
  "esModuleInterop=true",
  "importSuffix=.js",
  "env=node",
  "useDate=true",
  "forceLong=number",
  "oneof=unions-value",
  "useOptionals=none",
  "outputPartialMethods=true",
];
const python = process.env.PYTHON ?? "python3";

function generate(out) {
  const protos = readdirSync(join(protoRoot, "timeshard/v1"))
    .filter((name) => name.endsWith(".proto"))
    .map((name) => join(protoRoot, "timeshard/v1", name));
  execFileSync(
    python,
    [
      "-m",
      "grpc_tools.protoc",
      `--plugin=protoc-gen-ts_proto=${plugin}`,
      `--ts_proto_out=${out}`,
      `--ts_proto_opt=${options.join(",")}`,
      `-I${protoRoot}`,
      ...protos,
    ],
    { stdio: "inherit" },
  );
}

function files(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : [path];
  });
}

if (process.argv.includes("--check")) {
  const fresh = mkdtempSync(join(tmpdir(), "timeshard-gen-"));
  try {
    generate(fresh);
    const a = files(fresh).map((p) => relative(fresh, p)).sort();
    const b = files(committed).map((p) => relative(committed, p)).sort();
    const differ = [...new Set([...a, ...b])].filter(
      (p) =>
        !a.includes(p) ||
        !b.includes(p) ||
        readFileSync(join(fresh, p), "utf8") !== readFileSync(join(committed, p), "utf8"),
    );
    if (differ.length > 0) {
      console.error(`src/gen is out of date (${differ.join(", ")}): run \`npm run generate\``);
      process.exit(1);
    }
    console.log("src/gen matches the proto");
  } finally {
    rmSync(fresh, { recursive: true, force: true });
  }
} else {
  rmSync(committed, { recursive: true, force: true });
  mkdirSync(committed, { recursive: true });
  generate(committed);
}
