"""`mlxinfer info`: the platform, MLX and its device, which BLAS serves float32 matmuls, how a batch of
seeded rows is drawn, the compute-dtype rule."""

from __future__ import annotations

import typer

from mlxinfer_cli.common import JsonOption, print_json


def info(json_out: bool = JsonOption):
    """Show the platform, the MLX version and default device, the active BLAS and the `auto` compute-dtype rule."""
    import mlxinfer

    data = mlxinfer.system_info()
    if json_out:
        print_json(data)
        return
    render(data)


def render(data: dict) -> None:
    p, m, b, c = data["platform"], data["mlx"], data["blas"], data["compute_dtype"]
    lines = [
        f"platform      {p['system']} {p['machine']} ({p['release']}), Python {p['python']}",
        f"mlx           {m['version']}, default device {m['default_device']}",
    ]
    if b["active"]:
        layer = f", threading {b['threading_layer']}" if b["threading_layer"] else ""
        lines.append(f"blas          {b['library']}: {b['path']}{layer}")
    else:
        lines.append(f"blas          {b['library']} ({b['reason']})")
    check = b["float32_matmul_check"]
    if "error" in check:
        lines.append(f"              float32 matmul check failed: {check['error']}")
    else:
        verdict = "ok" if check["ok"] else "WRONG RESULTS"
        err = check["max_relative_error"]
        lines.append(f"              float32 matmul vs numpy: {verdict} (max rel. error {err:.1e})")
    d = data["batched_draw"]
    if d["active"]:
        lines.append(f"batch draws   one native call for all seeded rows: {d['path']} ({d['reason']})")
    else:
        lines.append(f"batch draws   mx.random.categorical row by row ({d['reason']})")
    h = data["heap"]
    lines.append(f"heap          {'large buffers kept by glibc' if h['applied'] else 'glibc defaults'} ({h['reason']})")
    hp = h["huge_pages"]
    pages = f"{hp['collapsed']} of {hp['spans']} 2 MiB spans of weights" if "spans" in hp else hp["reason"]
    lines.append(f"              huge pages: {pages}")
    q = data["quantized_matmul"]
    kernel = f"batch-invariant float32 kernel: {q['path']}" if q["active"] else "not in use"
    lines.append(f"quantized mm  {kernel} ({q['reason']})")
    ram = f"{c['ram_bytes'] / 2**30:.1f} GiB" if c["ram_bytes"] else "unknown"
    lines.append(f"compute dtype {c['auto_rule']}")
    lines.append(f"              here: device {c['device']}, fast BLAS {'yes' if c['fast_blas'] else 'no'}, RAM {ram}")
    typer.echo("\n".join(lines))
