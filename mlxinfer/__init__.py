"""mlxinfer: open a language model and see what it computes.

The public API, in the shape of mlx-lm's (`load`, `generate`, `stream_generate`):

    model, tokenizer = mlxinfer.load()                  # the embedded model; or a dir, .gguf, repo id
    mlxinfer.next_token_table(model, tokenizer, prompt)  # one forward pass: the lesson's table
    mlxinfer.generate(model, tokenizer, prompt, ...)     # text (or schema-valid JSON) and its stats
    mlxinfer.stream_generate(model, tokenizer, prompt)   # the same, a step at a time
    mlxinfer.sample(model, tokenizer, prompt, seeds=10)  # seeded experiment: one completion per seed
    mlxinfer.answers(model, tokenizer, prompt, settings=[{"temperature": 1}])  # each whole answer's exact p
    mlxinfer.prompt_logprobs(model, tokenizer, text)    # each prompt token's probability; the perplexity
    mlxinfer.count("path/to/model")                      # parameters and bytes, no mlx needed

Attributes load lazily so that `import mlxinfer` (and `count`) stays free of mlx until a
function needs it. Two modules are public whole: `mlxinfer.sampler` (the sampler's stages) and
`mlxinfer.defaults` (every default a user can see). Everything else a front end (the CLI, bench/,
the notebooks) uses is a name here; tests/test_boundary.py holds that line.
"""

from .cpu import blas as _blas

_blas.preload()  # a fast BLAS (MKL or OpenBLAS) must be loaded before anything imports mlx; see cpu/blas.py

from .open_files import keep_through_mlx_lm as _keep_through_mlx_lm  # noqa: E402

_keep_through_mlx_lm()  # before anything imports mlx-lm, whose import would lower the open-file limits

from .errors import MlxinferError, OutputError, check_listed_once  # noqa: E402
from .settings import GREEDY, GRID_FIELDS, SamplerSettings  # noqa: E402

_LAZY = {
    "load": ("model.loading", "load"),
    "count": ("counting", "count"),
    "parse_rate": ("counting", "parse_rate"),  # '400GB/s', '989T' -> per second, as count reads its rates
    "next_token_table": ("engine.tables", "next_token_table"),
    "next_token_scores": ("engine.tables", "next_token_scores"),
    "table_from_scores": ("engine.tables", "table_from_scores"),
    "explain": ("engine.tables", "explain"),
    "expert_routing": ("engine.tables", "expert_routing"),
    "generate": ("engine.generate", "generate"),
    "stream_generate": ("engine.generate", "stream_generate"),
    "ChatSession": ("engine.chat", "ChatSession"),
    "sample": ("engine.experiments", "sample"),
    "answers": ("engine.answers", "answers"),
    "prompt_logprobs": ("engine.reading", "prompt_logprobs"),
    "check_walk": ("engine.answers", "check_walk"),
    "prefill": ("engine.decode", "prefill"),
    "sweep": ("engine.sweep", "sweep"),
    "settings_grid": ("engine.sweep", "settings_grid"),
    "prompts_from_file": ("engine.prompt_list", "prompts_from_file"),
    "read_prompt": ("formats.paths", "read_prompt"),
    "read_messages": ("formats.paths", "read_messages"),
    "read_line": ("formats.paths", "read_line"),
    "embedded_model_path": ("formats.sources", "embedded_model_path"),  # the embedded GGUF, for a peer to read
    "seed_list": ("engine.request", "seed_list"),
    "check_batch_size": ("engine.request", "check_batch_size"),
    "check_stop": ("engine.request", "stop_strings"),
    "check_max_tokens": ("engine.request", "check_max_tokens"),
    "check_seed": ("engine.request", "check_seed"),
    "prepare": ("engine.request", "prepare"),
    "Constraint": ("engine.schema", "Constraint"),
    "check_settings": ("settings", "user_settings"),
    "check_temperature": ("settings", "check_temperature"),
    "launch_group": ("engine.ranks", "group"),
    "encode_prompt": ("tokenizer", "encode_prompt"),
    "system_info": ("model.system", "system_info"),
    "apply_compute_dtype": ("model.convert", "apply"),
    "is_quantized": ("model.params", "is_quantized"),
    "ModelInfo": ("model.info", "ModelInfo"),
    "benchmark": ("engine.bench", "run_bench"),
    "mlx_lm_twin": ("model.peers", "mlx_lm_twin"),
    "fork_cache": ("model.cache", "fork"),
    "find_openblas_shim": ("cpu.blas", "find_openblas_shim"),
    "serve": ("server", "serve"),
    "create_app": ("server", "create_app"),
    "defaults": ("defaults", None),
    "sampler": ("sampler", None),
    "ModelConfig": ("formats.config", "ModelConfig"),
    "strict_json_data": ("views", "finite"),  # what --json prints: -inf and NaN as None
}

__all__ = ["MlxinferError", "OutputError", "check_listed_once", "SamplerSettings", "GREEDY", "GRID_FIELDS", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        import inspect

        module, attr = _LAZY[name]
        found = importlib.import_module(f".{module}", __name__)
        if attr is None:
            return found
        found = getattr(found, attr)
        if inspect.isfunction(found):
            from .plain import plain_numbers

            found = plain_numbers(found)
        globals()[name] = found  # looked up once
        return found
    raise AttributeError(f"module 'mlxinfer' has no attribute {name!r}")


def __dir__():  # the lazy names too: Jupyter's and IPython's completion read dir()
    return sorted(set(globals()) | set(__all__))
