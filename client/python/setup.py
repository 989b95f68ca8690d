"""The build steps of the mla_offload package beyond pyproject.toml (which
holds its metadata): the stubs are generated while it builds, and an sdist
carries the proto it generates them from.

    python -m build client/python          # sdist and wheel, in a fresh venv
    pip install ./client/python            # the same, installed
    /usr/bin/python3 -m pip install --no-build-isolation client/python
                                           # with Debian's python3 packages

With build isolation (the first two) the stubs come from PyPI's
grpcio-tools, a build requirement, so they match the protobuf runtime pip
installs beside them. Without it (the third: Debian's python3-numpy,
python3-grpcio and python3-protobuf) grpcio-tools is used when installed,
else Debian's protoc and grpc_python_plugin.
"""

import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # an isolated build does not put this folder on the path
import generate_stubs  # pylint: disable=wrong-import-position


def _have_grpc_tools():
    try:
        import grpc_tools  # pylint: disable=import-outside-toplevel,unused-import
        return True
    except ImportError:
        return False


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs.generate(pathlib.Path(self.build_lib, "mla_offload", "_generated"),
                                grpc_tools=_have_grpc_tools())


class SdistWithProto(sdist):
    """Copies proto/mla_offload.proto (outside this folder) into the sdist, where
    generate_stubs.py looks for it first."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = pathlib.Path(base_dir, "proto")
        target.mkdir(exist_ok=True)
        shutil.copyfile(generate_stubs.DEFAULT_PROTO, target / "mla_offload.proto")


setup(
    cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProto},
    # Not "build": it would clash with the BUILD file where names ignore case.
    options={"build": {"build_base": "_build"}},
)
