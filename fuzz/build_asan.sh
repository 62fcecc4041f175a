#!/bin/sh
# Build datapipe/_jpeg_region.c with AddressSanitizer (gcc) into build/fuzz-asan/, beside, not over,
# the in-place extension the tests use. fuzz/run.py loads it from there for the jpeg_region target.
set -eu
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-build/fuzz-asan}
mkdir -p "$OUT"
INC=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
${CC:-gcc} -shared -fPIC -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -I"$INC" datapipe/_jpeg_region.c -ljpeg -o "$OUT/_jpeg_region$SUFFIX"
echo "$OUT/_jpeg_region$SUFFIX"
