"""`mlxinfer info`: the platform, MLX and its device, which BLAS serves float32 matmuls, the compute-dtype rule."""

from __future__ import annotations

import typer

from cli.app import app
from cli.common import JsonOption, print_json


@app.command("info")
def info(json_out: bool = JsonOption):
    """Show the platform, the MLX version and default device, the active BLAS and the `auto` compute-dtype rule."""
    data = gather()
    if json_out:
        print_json(data)
        return
    render(data)


def gather() -> dict:
    import platform
    import sys

    from mlxinfer import blas  # preload ran at `import mlxinfer`, before mlx below
    from mlxinfer.compute import AUTO_RULE, RAM_FRACTION, auto_rule, current_facts

    import mlx.core as mx

    status = blas.status()
    try:
        err = blas.verify()
        check = {"ok": err < 1e-4, "max_relative_error": err}
    except Exception as e:  # report, never crash: info is what you run when something is wrong
        check = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    facts = current_facts()
    ram = facts["ram_bytes"]
    return {
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "release": platform.release(),
            "python": platform.python_version(),
            "executable": sys.executable,
        },
        "mlx": {"version": mx.__version__, "default_device": str(mx.default_device())},
        "blas": {**status, "float32_matmul_check": check},
        "compute_dtype": {
            "choices": ["float32", "bfloat16", "auto"],
            "auto_rule": AUTO_RULE,
            "device": facts["device"],
            "fast_blas": facts["fast_blas"],
            "ram_bytes": ram,
            "float32_limit_bytes": ram // RAM_FRACTION if ram else None,
            # what auto would pick here for a 1 GiB float32 model, to show the rule applied
            "auto_for_1gib_float32": auto_rule(model_bytes_float32=2**30, **facts)[0],
        },
    }


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
    ram = f"{c['ram_bytes'] / 2**30:.1f} GiB" if c["ram_bytes"] else "unknown"
    lines.append(f"compute dtype {c['auto_rule']}")
    lines.append(f"              here: device {c['device']}, fast BLAS {'yes' if c['fast_blas'] else 'no'}, RAM {ram}")
    typer.echo("\n".join(lines))
