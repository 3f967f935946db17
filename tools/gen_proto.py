"""Generate the Python protobuf/gRPC code from proto/ into src/ (committed).

    python tools/gen_proto.py            # write src/timeshard/v1/*
    python tools/gen_proto.py --check    # exit 1 if the committed code differs (drift)

Proto package ``timeshard.v1`` lands as ``src/timeshard/v1/``, so the generated imports
(``from timeshard.v1 import timeshard_pb2``) work as they are, with no patching. The .proto
files are copied beside the code made from them, so the wheel carries the API's source at the
path protoc knows it by (``-I site-packages`` finds ``timeshard/v1/timeshard.proto``).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "src"
PACKAGE_DIR = Path("timeshard") / "v1"


def generate(into: Path) -> list[Path]:
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={into}",
        f"--pyi_out={into}",
        f"--grpc_python_out={into}",
        f"--plugin=protoc-gen-mypy_grpc={shutil.which('protoc-gen-mypy_grpc')}",
        f"--mypy_grpc_out={into}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (into / PACKAGE_DIR / "__init__.py").write_text(
        '"""Generated from proto/timeshard/v1 by tools/gen_proto.py. Do not edit."""\n'
    )
    for proto in protos:
        shutil.copyfile(proto, into / proto.relative_to(PROTO_ROOT))
    return sorted((into / PACKAGE_DIR).iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code drifted")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        target = OUT / PACKAGE_DIR
        if args.check:
            drifted = [
                p.name
                for p in fresh
                if not (target / p.name).exists() or not filecmp.cmp(p, target / p.name, False)
            ]
            if drifted:
                print(f"generated code drifted: {drifted}; run python tools/gen_proto.py")
                return 1
            return 0
        target.mkdir(parents=True, exist_ok=True)
        for p in fresh:
            shutil.copyfile(p, target / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
