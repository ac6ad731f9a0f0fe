"""Float32 matmuls through MKL and OpenBLAS vs MLX's bundled BLAS, and the embedded model on each path
(a benchmark, not a test).

Every path runs in its own worker process (the BLAS is chosen before mlx is imported, so
it is per process): MLXINFER_BLAS=none for MLX's bundled reference BLAS, =mkl for the `mkl`
package, =openblas for scipy-openblas32 through mlxinfer's shim (when it is built), and
optionally --blas PATH for another library.
Each worker loads the model once; the parent then asks the workers in turn, round after
round, so that the repeats are interleaved and a busy machine slows all paths alike.
Reported numbers are medians over the rounds, after one warm-up round.

    python bench/blas_matmul.py                       # 5 rounds, 64-token prefill, 32 decoded tokens
    python bench/blas_matmul.py --rounds 9 --blas /usr/lib/x86_64-linux-gnu/libopenblas.so.0
    python bench/blas_matmul.py --matmul-only
    python bench/blas_matmul.py --mkl-layers GNU,SEQUENTIAL --openblas-threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MATMUL_N = 1024
TEXT = (
    "The history of bread begins with flat cakes of ground grain baked on hot stones. Over thousands "
    "of years bakers learned to leaven dough with wild yeast, to grow stronger wheat, and to build ovens "
    "that hold an even heat. "
)


# ------------------------------------------------------------------------------- the worker


def worker(prefill: int, decode: int, with_model: bool, dtype: str) -> None:
    """Read commands on stdin ('matmul', 'model', 'quit'); answer one JSON line each on stdout."""
    import mlxinfer  # first: the BLAS preload must run before mlx is imported

    import mlx.core as mx

    blas = mlxinfer.system_info()["blas"]
    info = {"blas": blas, "describe": f"BLAS: {blas['library']} ({blas['path'] or blas['reason']})"}
    model = ids = None
    if with_model:
        model, tok = mlxinfer.load(None, compute_dtype="float32" if dtype == "float32" else "bfloat16")
        base = tok.encode(TEXT)
        ids = (base * (prefill // len(base) + 1))[:prefill]
        info["weights"] = model.info.weights
        info["describe"] += f" · weights: {model.info.weights}" + (" · CPU kernels" if model.info.cpu_kernels else "")
    a = mx.random.normal((MATMUL_N, MATMUL_N), key=mx.random.key(0))
    b = mx.random.normal((MATMUL_N, MATMUL_N), key=mx.random.key(1))
    mx.eval(a, b)
    _reply(info)

    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "matmul":
            t0 = time.perf_counter()
            mx.eval(a @ b)
            _reply({"matmul_s": time.perf_counter() - t0})
        elif cmd == "model":
            cache = model.make_cache()
            t0 = time.perf_counter()
            scores = model(mx.array([ids]), cache)[:, -1]
            token = mx.argmax(scores, axis=-1)
            mx.eval(token)
            t1 = time.perf_counter()
            for _ in range(decode):
                token = mx.argmax(model(token.reshape(1, 1), cache)[:, -1], axis=-1)
                mx.eval(token)
            t2 = time.perf_counter()
            _reply({"prefill_tps": prefill / (t1 - t0), "decode_tps": decode / (t2 - t1)})
        elif cmd == "quit":
            return


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------- the parent


class Worker:
    def __init__(self, args, label: str, blas: str, dtype: str, extra_env: dict | None = None):
        self.label, self.blas_env, self.dtype = label, blas, dtype
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--dtype",
            dtype,
            "--prefill",
            str(args.prefill),
            "--decode",
            str(args.decode),
        ] + (["--matmul-only"] if args.matmul_only else [])
        env = {**os.environ, "MLXINFER_BLAS": blas, **(extra_env or {})}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )  # stderr: inherited, so warnings show
        self.info = self._read()
        self.samples: dict[str, list[float]] = {}

    def ask(self, cmd: str, keep: bool = True) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        for key, value in reply.items():
            if keep:
                self.samples.setdefault(key, []).append(value)
        print(
            f"  {self.label}: " + ", ".join(f"{k} {v:.3g}" for k, v in reply.items()) + ("" if keep else " (warm-up)"),
            file=sys.stderr,
        )

    def median(self, key: str) -> float:
        return statistics.median(self.samples[key])

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker '{self.label}' died (its stderr is above)")
        return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (after one warm-up round)")
    ap.add_argument("--prefill", type=int, default=64, help="prompt tokens for the prefill")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded one at a time after the prefill")
    ap.add_argument("--blas", default=None, help="also run with MLXINFER_BLAS=PATH (e.g. an OpenBLAS)")
    ap.add_argument("--matmul-only", action="store_true", help="skip the model rows")
    ap.add_argument(
        "--mkl-layers",
        default=None,
        help="MKL_THREADING_LAYER values to compare, e.g. GNU,SEQUENTIAL (default: blas.py's choice)",
    )
    ap.add_argument(
        "--openblas-threads",
        default=None,
        help="OPENBLAS_NUM_THREADS values to compare, e.g. 1,2 (default: OpenBLAS's choice)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.prefill, args.decode, not args.matmul_only, args.dtype)
        return

    paths = [
        ("4-bit weights, MLX quantized matmul", "none", "as-loaded"),
        ("float32 weights, MLX's bundled BLAS", "none", "float32"),
    ]
    if args.blas:
        paths.append((f"float32 weights, {Path(args.blas).name}", args.blas, "float32"))
    if args.mkl_layers:
        for layer in args.mkl_layers.split(","):
            paths.append((f"float32 weights, MKL {layer}", "mkl", "float32", {"MKL_THREADING_LAYER": layer}))
    else:
        paths.append(("float32 weights, MKL", "mkl", "float32"))
    sys.path.insert(0, str(REPO))
    from mlxinfer import find_openblas_shim  # the parent never imports mlx

    if find_openblas_shim():
        for n in (args.openblas_threads or "").split(",") if args.openblas_threads else [None]:
            env = {"OPENBLAS_NUM_THREADS": n} if n else {}
            paths.append((f"float32 weights, OpenBLAS{f' x{n}' if n else ''}", "openblas", "float32", env))
    else:
        print("note: no OpenBLAS row: the shim is not built (python -m mlxinfer.cpu.openblas_shim)", file=sys.stderr)
    if args.matmul_only:
        paths = [p for p in paths if p[2] == "float32"]

    print(f"starting {len(paths)} workers (each loads the model once) ...", file=sys.stderr)
    workers = [Worker(args, *p) for p in paths]
    try:
        for w in workers:
            if w.blas_env != "none" and not w.info["blas"]["active"]:
                print(f"note: no fast BLAS in '{w.label}': {w.info['blas']['reason']}", file=sys.stderr)
        for r in range(args.rounds + 1):  # round 0 warms up
            print(f"round {r}/{args.rounds}", file=sys.stderr)
            for w in workers:
                if not args.matmul_only:
                    w.ask("model", keep=r > 0)
                if w.dtype == "float32":
                    w.ask("matmul", keep=r > 0)
    finally:
        for w in workers:
            w.close()

    print(f"\nmedians of {args.rounds} interleaved rounds; {os.cpu_count()} CPUs; {sys.executable}\n")
    print(f"| {MATMUL_N}^3 float32 matmul | BLAS | seconds | GFLOP/s |")
    print("|---|---|---|---|")
    for w in workers:
        if "matmul_s" in w.samples:
            s = w.median("matmul_s")
            print(f"| {w.label.split(', ')[-1]} | {_blas(w)} | {s:.3f} | {2 * MATMUL_N**3 / s / 1e9:.1f} |")
    if args.matmul_only:
        return
    print(f"\n| path | BLAS | weights | prefill tok/s ({args.prefill} tokens) | decode tok/s ({args.decode} tokens) |")
    print("|---|---|---|---|---|")
    for w in workers:
        print(
            f"| {w.label} | {_blas(w)} | {w.info.get('weights', '?')} | {w.median('prefill_tps'):.1f} "
            f"| {w.median('decode_tps'):.1f} |"
        )


def _blas(w: Worker) -> str:
    b = w.info["blas"]
    if b["active"]:
        return f"{b['library']}" + (f" ({b['threading_layer']})" if b["threading_layer"] else "")
    return b["library"]


if __name__ == "__main__":
    main()
