#!/bin/sh
# The sidecar image's Python environment (containers/sidecar/Dockerfile runs this; tests/test_containers.py too):
# a virtualenv at PREFIX holding poolpipe's wheel, built from this checkout, and its dependencies from PyPI.
#   usage: sh containers/sidecar/build-env.sh PREFIX [PIP-INSTALL-OPTION...]
# Ends by running 'poolpipe serve --help' from PREFIX, so a broken environment fails the build.
set -eu
prefix=$1
shift
src=$(cd "$(dirname "$0")/../.." && pwd)
"${PYTHON:-python3}" -m venv "$prefix"
"$prefix/bin/pip" wheel --quiet --no-cache-dir --no-deps --wheel-dir "$prefix/wheels" "$src"
wheel=$(ls "$prefix"/wheels/poolpipe-*.whl)
"$prefix/bin/pip" install --quiet --no-cache-dir "$@" "$wheel[cpu]"  # ONNX Runtime's CPU distribution
rm -rf "$prefix/wheels"
"$prefix/bin/poolpipe" serve --help >/dev/null
echo "poolpipe environment ready: $prefix"
