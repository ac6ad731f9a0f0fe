"""Sliding-window attention, as mlx-lm runs it: a layer with a window attends to (and keeps the keys and
values of) the last `sliding_window` tokens only, so past the window its share of a token's work stops
growing. Gemma 3 (every `sliding_window_pattern`-th layer sees the whole context), GPT-OSS, and Llama-family
configs that list `layer_types` have such layers; a window a config names but mlx-lm's class does not apply
(Mistral's, Phi-3's, Qwen2's unused one) counts as the whole context."""

from __future__ import annotations

from ..errors import is_whole
from ..formats.config import ModelConfig

READS_LAYER_TYPES = ("llama", "gpt_oss")  # mlx-lm's classes that take each layer's kind from config.json


def attention_windows(cfg: ModelConfig) -> tuple[int | None, ...]:
    """Each layer's window in tokens; None: it attends to the whole context."""
    L, raw = cfg.num_hidden_layers, cfg.raw
    if cfg.model_type == "gemma3" and isinstance(raw.get("text_config"), dict):  # mlx-lm runs it as gemma3_text
        raw = raw["text_config"]
    w = raw.get("sliding_window")
    if not is_whole(w) or w <= 0 or raw.get("use_sliding_window") is False:
        return (None,) * L
    types = raw.get("layer_types")
    if cfg.model_type in READS_LAYER_TYPES and isinstance(types, list) and len(types) == L:
        return tuple(w if t == "sliding_attention" else None for t in types)
    if cfg.model_type in ("gemma3_text", "gemma3"):  # mlx-lm's rule: layer i is global where (i + 1) % pattern == 0
        pattern = raw.get("sliding_window_pattern", 6)
        pattern = pattern if is_whole(pattern) and pattern > 0 else 6
        return tuple(None if (i + 1) % pattern == 0 else w for i in range(L))
    if cfg.model_type == "gpt_oss":  # mlx-lm's default: sliding and full in turn
        return tuple(w if i % 2 == 0 else None for i in range(L))
    return (None,) * L


def attended(n: int, windows) -> int:
    """Layer-token pairs one token at position n attends to: sum over layers of min(n, window)."""
    return sum(n if w is None else min(n, w) for w in windows)


def attended_over(first: int, passes: int, windows) -> int:
    """attended(first + k) summed over the passes k = 0 .. passes-1, exactly (passes may be ~1e12)."""
    total = 0
    for w in windows:
        if w is None:
            total += passes * first + passes * (passes - 1) // 2  # every pass sees first + k
            continue
        below = min(max(w - first, 0), passes)  # the passes that have not reached the window yet
        total += below * first + below * (below - 1) // 2 + (passes - below) * w
    return total


def crossover(target: float, windows) -> float | None:
    """The smallest position n (real) where attended(n) reaches target; None where it never does (every
    layer windowed, their windows' sum below it)."""
    growing, fixed, start = len(windows), 0, 0
    for w in sorted(w for w in windows if w is not None) + [None]:
        if growing and (w is None or fixed + growing * w >= target):
            return max((target - fixed) / growing, start)
        if w is None:
            return None
        fixed, growing, start = fixed + w, growing - 1, w
    return None
