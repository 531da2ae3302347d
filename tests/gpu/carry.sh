#!/bin/bash
# Prepare, on this machine, what the GPU machine needs and cannot fetch (docs/development.md,
# "The GPU path"): wheels of the packages its image lacks (.whl/), the embedded GGUF in two
# halves (.gpucarry/a, .gpucarry/b: 94 MiB, over one call's 64 MiB) and 64 SciQ questions.
# Both folders are ignored (.git/info/exclude); tests/gpu/on_device.sh reads them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gpucarry/\n' >> .git/info/exclude
rm -rf .whl .gpucarry && mkdir -p .whl .gpucarry/a .gpucarry/b/data/sciq
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  langchain-core==1.8.3 langchain-protocol==0.0.20 jsonpatch==1.48 jsonpointer==3.12 \
  tenacity==9.2.1 uuid-utils==0.19.0 langsmith==0.15.1 distro httpx2==2.16.2 \
  httpcore2==2.16.2 truststore orjson==3.13.0 requests-toolbelt==1.0.0 sniffio websockets \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection==0.4.5 \
  typing-extensions==4.16.0 gguf==0.19.0 pysbd==0.3.4
gguf=$("$python" -c "from esi_guard.backends import embedded_gguf; print(embedded_gguf())")
head -c 52428800 "$gguf" > .gpucarry/a/gguf.a
tail -c +52428801 "$gguf" > .gpucarry/b/gguf.b
shared=$("$python" -c "from benchmarks.shared_data import shared_data; print(shared_data())")
head -n 64 "$shared/sciq/test.jsonl" > .gpucarry/b/data/sciq/test.jsonl
du -sh .whl .gpucarry/a .gpucarry/b
