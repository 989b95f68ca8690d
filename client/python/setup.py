"""Installs the mla_offload package; its stubs are generated while it builds.

    /usr/bin/python3 -m pip install --no-build-isolation client/python

The build step runs generate_stubs.py (Debian's protoc and grpc_python_plugin
on ../../proto/mla_offload.proto) into the package's _generated folder of the
build tree, so the installed package carries them and the source tree stays
clean. The runtimes (numpy, grpcio, protobuf) are Debian's python3-numpy,
python3-grpcio and python3-protobuf, or the same projects from PyPI.
"""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

import generate_stubs


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs.generate(pathlib.Path(self.build_lib, "mla_offload", "_generated"))


setup(
    name="mla-offload",
    version="0.1.0",
    description="Python client of mla-offload, the DeepSeek-V4 sparse MLA attention-offload server",
    packages=["mla_offload"],
    python_requires=">=3.9",
    install_requires=["numpy", "grpcio>=1.51", "protobuf>=4.21"],
    cmdclass={"build_py": BuildWithStubs},
    # Not "build": it would clash with the BUILD file where names ignore case.
    options={"build": {"build_base": "_build"}},
)
