#!/usr/bin/python3
"""Generates the Python protobuf and gRPC stubs of proto/mla_offload.proto.

Runs protoc with --python_out and the gRPC Python plugin, writing
mla_offload_pb2.py, mla_offload_pb2_grpc.py and an empty __init__.py into
OUT_DIR: Debian's protoc (protobuf-compiler) and /usr/bin/grpc_python_plugin
(protobuf-compiler-grpc), or with --grpc_tools PyPI's grpcio-tools (the
package build's requirement, pyproject.toml: its protoc matches the protobuf
runtime pip installs beside it). The stubs are never committed: setup.py
calls this when the package is built and Bazel's genrule
(client/python/BUILD) at test time.

The gRPC plugin writes `import mla_offload_pb2`, an absolute import that
only works with OUT_DIR itself on sys.path; it is rewritten to a relative
import so that OUT_DIR can be a subpackage (mla_offload._generated).

Usage: generate_stubs.py [--proto PATH] [--protoc PATH] [--plugin PATH] [--grpc_tools] OUT_DIR
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# An sdist carries its copy (setup.py); the source tree has the original.
DEFAULT_PROTO = next((path for path in (HERE / "proto" / "mla_offload.proto",
                                        HERE.parent.parent / "proto" / "mla_offload.proto")
                      if path.is_file()), HERE.parent.parent / "proto" / "mla_offload.proto")
DEFAULT_PROTOC = "/usr/bin/protoc"
DEFAULT_PLUGIN = "/usr/bin/grpc_python_plugin"
ABSOLUTE_IMPORT = "import mla_offload_pb2 as "
RELATIVE_IMPORT = "from . import mla_offload_pb2 as "


def protoc_command(grpc_tools=False, protoc=None, plugin=None):
    """The protoc to run, with its gRPC Python plugin: grpcio-tools' (its
    module grpc_tools.protoc) when `grpc_tools`, else Debian's (first: the
    stubs of another protoc may need a newer protobuf runtime than Debian's
    python3-protobuf)."""
    if grpc_tools:
        try:
            import grpc_tools  # pylint: disable=import-outside-toplevel,unused-import
        except ImportError as error:
            raise RuntimeError("grpcio-tools is not installed (pip install grpcio-tools)") from error
        return [sys.executable, "-m", "grpc_tools.protoc"]
    protoc = protoc or (DEFAULT_PROTOC if os.access(DEFAULT_PROTOC, os.X_OK)
                        else shutil.which("protoc") or DEFAULT_PROTOC)
    plugin = plugin or (DEFAULT_PLUGIN if os.access(DEFAULT_PLUGIN, os.X_OK)
                        else shutil.which("grpc_python_plugin") or DEFAULT_PLUGIN)
    for tool, package in ((protoc, "protobuf-compiler"), (plugin, "protobuf-compiler-grpc")):
        if not os.access(tool, os.X_OK):
            raise RuntimeError(f"{tool} not found: install Debian's {package}, or build with "
                               "grpcio-tools (--grpc_tools)")
    return [protoc, f"--plugin=protoc-gen-grpc_python={plugin}"]


def generate(out_dir, proto=DEFAULT_PROTO, protoc=None, plugin=None, grpc_tools=False):
    """Writes the stubs of `proto` into `out_dir` (created if missing)."""
    proto = pathlib.Path(proto).resolve()
    out_dir = pathlib.Path(out_dir)
    command = protoc_command(grpc_tools, protoc, plugin)
    if not proto.is_file():
        raise RuntimeError(f"{proto} not found (pass --proto)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [*command, f"--proto_path={proto.parent}", f"--python_out={scratch}",
             f"--grpc_python_out={scratch}", str(proto)],
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
    parser.add_argument("--grpc_tools", action="store_true",
                        help="use PyPI's grpcio-tools instead of Debian's protoc")
    args = parser.parse_args(argv)
    try:
        generate(args.out_dir, args.proto, args.protoc, args.plugin, args.grpc_tools)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"generate_stubs: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
