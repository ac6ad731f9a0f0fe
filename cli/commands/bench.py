"""`mlxinfer bench`: our speed beside mlx-lm's, measured side by side in one run."""

from __future__ import annotations

from typing import List, Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import JsonOption, ModelOption, print_json, progress_bar
from mlxinfer_cli.options import parse_numbers


def bench(
    model: Optional[str] = ModelOption,
    prompt_tokens: List[str] = typer.Option(
        [",".join(map(str, defaults.BENCH_PROMPT_TOKENS))], "--prompt-tokens", help="Prompt lengths, e.g. '32,128,512'."
    ),
    gen_tokens: int = typer.Option(64, "--gen-tokens", help="Tokens to decode per run."),
    repeats: int = typer.Option(3, "--repeats", help="Interleaved repeats; figures are medians."),
    bandwidth: Optional[str] = typer.Option(
        None,
        "--bandwidth",
        help="Memory bandwidth for the roofline, with its unit: 400GB/s, 0.4TB/s, 4000MB/s (default: measured). "
        "Prefixes are decimal (k M G T = 10^3 .. 10^12), Ki Mi Gi Ti binary; a bare number is read as GB/s "
        "for one more release, with a notice.",
    ),
    fast_path: bool = typer.Option(
        True, "--fast/--no-fast", help="Also run the float32 path (dequantized weights, BLAS)."
    ),
    llama_cpp: bool = typer.Option(
        True, "--llama-cpp/--no-llama-cpp", help="Also run llama.cpp on a GGUF model when llama_cpp is importable."
    ),
    json_out: bool = JsonOption,
):
    """Load, prefill, time to first token, decode and peak memory: ours, mlx-lm's, and their ratios."""
    from mlxinfer import benchmark

    lengths = parse_numbers(prompt_tokens, "--prompt-tokens", int)
    gb_s = None if bandwidth is None else bandwidth_gb_s(bandwidth)
    engines = 3 if fast_path else 2
    bar, update = progress_bar(repeats * len(lengths) * engines, "benchmark", enabled=not json_out)
    with bar:
        report = benchmark(model, lengths, gen_tokens, repeats, gb_s, fast_path, progress=update, llama_cpp=llama_cpp)
    if json_out:
        print_json(report.to_dict())
    else:
        print(markdown(report))


def bandwidth_gb_s(text: str) -> float:
    """--bandwidth as count reads it ('400GB/s', '0.4TB/s') -> GB/s; a bare number, the old spelling, is GB/s."""
    import mlxinfer

    try:
        old = float(text)
    except ValueError:
        return mlxinfer.parse_rate(text, "bandwidth") / 1e9
    gb_s = mlxinfer.parse_rate(old, "bandwidth")
    flags.renamed(f"--bandwidth {text}", f"--bandwidth {text}GB/s", "a bare number")
    return gb_s


BUSY = 0.1  # other processes' share of the cores during the runs past which the report says so


def markdown(report) -> str:
    lines = [
        f"model: {report.model}  ",
        f"machine: {report.machine}  ",
        f"{report.blas}  ",
        f"greedy, {report.gen_tokens} generated tokens, medians of {report.repeats} interleaved repeats; "
        f"ratios are ours / mlx-lm's  ",
        "",
        "| engine | weights | prompt | load s | TTFT s | prefill tok/s | decode tok/s | prefill x | decode x "
        "| roofline | peak MB | tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.rows:
        load = "—" if r.load_s is None else f"{r.load_s:.2f}"
        peak = "—" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 1e6:.0f}"
        lines.append(
            f"| {r.engine} | {r.path} | {r.prompt_tokens} | {load} | {r.ttft_s:.2f} | "
            f"{r.prefill_tokens_per_s:.1f} | {r.decode_tokens_per_s:.1f} | {r.prefill_ratio:.2f} | "
            f"{r.decode_ratio:.2f} | {r.roofline_fraction:.0%} | {peak} | "
            f"{'same' if r.same_tokens else 'DIFFER'} |"
        )
    lines.append("")
    busy = report.other_cpu_fraction
    if busy is not None and busy >= BUSY:
        lines += [
            f"**the machine was busy**: other processes used {busy:.0%} of its cores during the runs, so these "
            "are not a quiet machine's timings (llama.cpp's spinning threads lose most); rerun when it is quiet  ",
            "",
        ]
    for name, peer in report.peers.items():  # which build of the peer ran, in its own words
        lines.append(f"{name} {peer['version']}: {peer['system_info']}  ")
        theirs = {r.prompt_tokens: r for r in report.rows if r.engine == name}
        ours = [r for r in report.rows if r.engine.startswith("mlxinfer") and r.prompt_tokens in theirs]
        for r in ours:
            t = theirs[r.prompt_tokens]
            lines.append(
                f"- {r.engine} / {name} at {r.prompt_tokens} prompt tokens: prefill "
                f"{r.prefill_tokens_per_s / t.prefill_tokens_per_s:.2f}x, decode "
                f"{r.decode_tokens_per_s / t.decode_tokens_per_s:.2f}x  "
            )
        lines.append("")
    lines.append(
        f"roofline: memory bandwidth {report.bandwidth_gb_s:.1f} GB/s ({report.bandwidth_source}); decode can "
        "be no faster than bandwidth / weight bytes read per token:"
    )
    for name, r in report.roofline.items():
        lines.append(
            f"- {name}: {r['bytes_per_token'] / 1e6:.1f} MB per token -> at most {r['max_tokens_per_s']:.0f} tok/s"
        )
    lines.append(f"\n`mlxinfer --help` start-up: {report.help_seconds:.2f} s over `python -c pass`")
    return "\n".join(lines)
