"""The ``esi-guard`` CLI's choices and shared options (typer annotations)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from esi_guard.backends.adapters import LocalBackend

__all__ = [
    "AnswersField",
    "AnswersSep",
    "ApiBase",
    "ApiMode",
    "BatchSize",
    "Cache",
    "ChatTemplateOption",
    "DType",
    "Data",
    "Device",
    "Distance",
    "Granularity",
    "IncorrectField",
    "InterventionName",
    "InterventionOption",
    "Judge",
    "LabelMethod",
    "LabelThreshold",
    "Labels",
    "Limit",
    "LocalBackend",
    "MaxNewTokens",
    "Model",
    "NVariants",
    "PromptFile",
    "QuestionField",
    "RayAddress",
    "Resamples",
    "Runner",
    "ScoreName",
    "Seed",
    "Selection",
    "System",
    "Threads",
    "TopK",
    "Workers",
]


class LabelMethod(str, Enum):
    """How correctness is decided."""

    containment = "containment"
    exact = "exact"
    f1 = "f1"
    semantic = "semantic"
    judge = "judge"


class ScoreName(str, Enum):
    """What the threshold applies to."""

    esi = "esi"
    combined = "combined"


class Granularity(str, Enum):
    """What a threshold decides: whole answers or each sentence."""

    answer = "answer"
    sentence = "sentence"


class Selection(str, Enum):
    """How the threshold is chosen."""

    risk = "risk"
    coverage = "coverage"
    f1 = "f1"
    youden = "youden"


class InterventionName(str, Enum):
    """Character-level interventions available from the command line."""

    soc = "soc"
    typo = "typo"


# -- shared options ---------------------------------------------------------------------

Data = Annotated[
    list[Path],
    typer.Option(
        "--data",
        help="QA file (JSONL/CSV/SQuAD JSON; question/answers/wrong and the shared formats "
        "known). Repeat for several files: concatenated in order, --limit and --seed apply "
        "to each.",
    ),
]
QuestionField = Annotated[str | None, typer.Option(help="Question field of other formats.")]
AnswersField = Annotated[str | None, typer.Option(help="Gold answers field of other formats.")]
IncorrectField = Annotated[
    str | None,
    typer.Option(help="Known wrong answers field, used by semantic/judge labels (optional)."),
]
AnswersSep = Annotated[
    str,
    typer.Option(
        help="What separates the answers (and wrong answers) in a CSV cell. Default: '; ' "
        "(semicolon, space), as TruthfulQA writes them.",
        show_default=False,
    ),
]
Limit = Annotated[
    int | None,
    typer.Option(min=1, help="Use the first N examples of each file (after --seed)."),
]
Seed = Annotated[int | None, typer.Option(help="Shuffle the examples with this seed first.")]
Model = Annotated[
    str, typer.Option(help="'default' (embedded SmolLM2), a HF id/path or .gguf file.")
]
ApiBase = Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (API backend).")]
ApiMode = Annotated[str, typer.Option(help="API backend mode: echo, chat or auto.")]
Device = Annotated[str | None, typer.Option(help="Device for local models (cpu, cuda...).")]
DType = Annotated[
    str | None,
    typer.Option(help="transformers' dtype (auto, float32, bfloat16...): as you serve it."),
]
ChatTemplateOption = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="A Jinja chat template file overriding the model's, or 'completion' for a base "
        "model that has none (the messages' text, then 'Answer:').",
    ),
]
Runner = Annotated[
    LocalBackend,
    typer.Option(
        "--backend",
        help="What runs a local model: auto (what the guard uses: llamacpp for 'default' "
        "or a .gguf file when llama-cpp-python is installed and no --dtype or GPU --device "
        "is asked for, else transformers), transformers (any HF model, GPUs, bfloat16) or "
        "llamacpp (loads in a second; a small quantized model forces its variants on a "
        "float16 copy). Calibrate on the engine you serve with: the file records it.",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="CPU threads of the local model: every llama.cpp decode, the float16 forcing "
        "copy's included (default: llama.cpp's own, every core for forcing), or "
        "transformers' torch.set_num_threads (process-wide). Give 1 where several runs "
        "share few cores. Not part of the run's identity: a cache scored with other "
        "threads is resumed.",
    ),
]
Cache = Annotated[
    Path | None,
    typer.Option(
        help="JSONL cache of per-example results and their labels; reruns resume from it "
        "(a complete one needs no model). Default: esi-cache-<data>-<id>.jsonl here."
    ),
]
BatchSize = Annotated[int, typer.Option(min=1, help="Questions per batched guard call.")]
Workers = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Score on N Ray workers, one guard each, the same batches as one process "
        "(the ray extra; each worker holds --threads CPUs, default 1).",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="--workers: a running Ray cluster (default RAY_ADDRESS, else a "
        "local one started here)."
    ),
]
System = Annotated[
    str | None,
    typer.Option(
        help="System prompt before each question ('' for none). Default: a short-answer "
        "instruction for closed-book data, none with a --prompt template or passage data."
    ),
]
PromptFile = Annotated[
    Path | None,
    typer.Option(
        "--prompt",
        help="Template file with {question} (and {context} for data with passages, such as "
        "SQuAD 2.0); only {question} is intervened on. Default for passage data: the "
        "built-in RAG template.",
    ),
]
Labels = Annotated[LabelMethod, typer.Option(help="Correctness labels.")]
LabelThreshold = Annotated[
    float | None, typer.Option(help="Threshold of f1 (0.5) or semantic (0.7) labels.")
]
Judge = Annotated[
    str | None, typer.Option(help="module:attribute of a LangChain chat model, for --labels judge.")
]
Resamples = Annotated[int, typer.Option(help="Bootstrap resamples for the intervals.")]
InterventionOption = Annotated[InterventionName, typer.Option()]
NVariants = Annotated[int, typer.Option(help="L, variants per question.")]
TopK = Annotated[int, typer.Option(help="k, tokens kept per distribution.")]
Distance = Annotated[str, typer.Option(help="hellinger, squared_hellinger, kl...")]
MaxNewTokens = Annotated[
    int, typer.Option(help="Most tokens per answer (the guard's default too).")
]
