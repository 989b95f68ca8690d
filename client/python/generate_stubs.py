#!/usr/bin/python3
"""Generates the Python protobuf and gRPC stubs of proto/mla_offload.proto.

Runs Debian's protoc (protobuf-compiler) with --python_out and its gRPC
plugin /usr/bin/grpc_python_plugin (protobuf-compiler-grpc), writing
mla_offload_pb2.py, mla_offload_pb2_grpc.py and an empty __init__.py into
OUT_DIR. The stubs are never committed: setup.py calls this at install time
and Bazel's genrule (client/python/BUILD) at test time.

The gRPC plugin writes `import mla_offload_pb2`, an absolute import that
only works with OUT_DIR itself on sys.path; it is rewritten to a relative
import so that OUT_DIR can be a subpackage (mla_offload._generated).

Usage: generate_stubs.py [--proto PATH] [--protoc PATH] [--plugin PATH] OUT_DIR
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_PROTO = HERE.parent.parent / "proto" / "mla_offload.proto"
DEFAULT_PROTOC = "/usr/bin/protoc"
DEFAULT_PLUGIN = "/usr/bin/grpc_python_plugin"
ABSOLUTE_IMPORT = "import mla_offload_pb2 as "
RELATIVE_IMPORT = "from . import mla_offload_pb2 as "


def generate(out_dir, proto=DEFAULT_PROTO, protoc=None, plugin=None):
    """Writes the stubs of `proto` into `out_dir` (created if missing)."""
    proto = pathlib.Path(proto).resolve()
    out_dir = pathlib.Path(out_dir)
    # Debian's first: the stubs of another protoc may need a newer protobuf
    # runtime than Debian's python3-protobuf.
    protoc = protoc or (DEFAULT_PROTOC if os.access(DEFAULT_PROTOC, os.X_OK)
                        else shutil.which("protoc") or DEFAULT_PROTOC)
    plugin = plugin or (DEFAULT_PLUGIN if os.access(DEFAULT_PLUGIN, os.X_OK)
                        else shutil.which("grpc_python_plugin") or DEFAULT_PLUGIN)
    for tool, package in ((protoc, "protobuf-compiler"), (plugin, "protobuf-compiler-grpc")):
        if not os.access(tool, os.X_OK):
            raise RuntimeError(f"{tool} not found: install Debian's {package}")
    if not proto.is_file():
        raise RuntimeError(f"{proto} not found (pass --proto)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [protoc, f"--proto_path={proto.parent}", f"--python_out={scratch}",
             f"--grpc_python_out={scratch}", f"--plugin=protoc-gen-grpc_python={plugin}",
             str(proto)],
            check=True)
        stem = proto.stem
        grpc_module = pathlib.Path(scratch, f"{stem}_pb2_grpc.py")
        text = grpc_module.read_text()
        if ABSOLUTE_IMPORT not in text:
            raise RuntimeError(f"{grpc_module.name}: no '{ABSOLUTE_IMPORT}' line to rewrite")
        grpc_module.write_text(text.replace(ABSOLUTE_IMPORT, RELATIVE_IMPORT, 1))
        for name in (f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"):
            shutil.copyfile(pathlib.Path(scratch, name), out_dir / name)
    (out_dir / "__init__.py").write_text('"""Generated from proto/mla_offload.proto; do not edit."""\n')


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--proto", default=DEFAULT_PROTO)
    parser.add_argument("--protoc")
    parser.add_argument("--plugin")
    args = parser.parse_args(argv)
    try:
        generate(args.out_dir, args.proto, args.protoc, args.plugin)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"generate_stubs: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
