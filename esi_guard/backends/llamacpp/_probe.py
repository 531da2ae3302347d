"""One token decoded by llama.cpp in a process of its own, for ``esi-guard env``.

A crash in llama.cpp's kernels kills its process, so ``esi-guard env`` runs this as a child and
reads what it printed: a JSON line once llama-cpp-python is imported (version, system info), one
once the token is decoded: ``python -m esi_guard.backends.llamacpp._probe [model.gguf]``.
"""

from __future__ import annotations

import json
import sys
import time

from esi_guard.backends._embedded_files import embedded_gguf
from esi_guard.backends.llamacpp._loading import load_llama, repacking_off
from esi_guard.backends.llamacpp._runtime import import_llama_cpp
from esi_guard.exceptions import ESIGuardError

PROMPT = "The capital of France is"


def main(argv: list[str]) -> int:
    """Print llama.cpp's system info, then decode one token of :data:`PROMPT` and print it."""
    llama_cpp = import_llama_cpp()
    head = {
        "version": getattr(llama_cpp, "__version__", "?"),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
        "repacking_off": repacking_off(),
    }
    print(json.dumps(head), flush=True)
    try:
        path = argv[0] if argv else str(embedded_gguf())
        started = time.perf_counter()
        llama = load_llama(path, n_ctx=64, n_threads=1, n_threads_batch=1, verbose=False)
        out = llama.create_completion(PROMPT, max_tokens=1, temperature=0.0)
        seconds = time.perf_counter() - started
    except (ESIGuardError, ValueError, RuntimeError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps({"text": out["choices"][0]["text"], "seconds": seconds}), flush=True)
    llama.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
