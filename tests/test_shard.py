"""A model split across ranks (tensor parallelism on mx.distributed): two ranks on 127.0.0.1 (ring
backend, CPU) give one process's logits, greedy tokens and seeded texts, each holding well under
the whole model; `count --ranks` prices the split; bad splits, unreachable ranks and ranks holding
different models stop every rank with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, free_ports, invoke_cli

import mlxinfer
import checkpoints
import mlx.core as mx
from mlxinfer.counting import split
from mlxinfer.errors import MlxinferError
from mlxinfer.formats import gguf, sources

LAUNCH = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
ENV = {"OPENBLAS_NUM_THREADS": "1"}  # two ranks share this machine's cores: one BLAS thread each
FRUIT = "Name one fruit. Answer with one word."


def launch(*args: str, ranks: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """`mlx.launch --backend ring -n RANKS --hosts 127.0.0.1 ... ARGS` (ARGS: a script, or -m mlxinfer ...)."""
    port = str(free_ports(ranks))
    env = [x for k, v in ENV.items() for x in ("--env", f"{k}={v}")]
    cmd = [LAUNCH, "--backend", "ring", "-n", str(ranks), "--hosts", "127.0.0.1", "--starting-port", port]
    cmd += [*env, "--cwd", str(ROOT), "--python", sys.executable, "--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def spawn(per_rank: list[list[str]], tmp_path, ranks: int | None = None, env: dict | None = None, timeout=300):
    """Start `python -m mlxinfer ARGS` as ranks 0..len-1 of a ring of `ranks` (default: as many) on
    127.0.0.1, the way mlx.launch does (MLX_RANK, MLX_HOSTFILE), each with its own arguments; their
    CompletedProcesses, so that each rank's exit code can be read."""
    port = free_ports(ranks or len(per_rank))
    hostfile = tmp_path / f"hosts{port}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port + i}"] for i in range(ranks or len(per_rank))]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "mlxinfer", *args],
            cwd=ROOT,
            env={**os.environ, **ENV, **(env or {}), "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, args in enumerate(per_rank)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


# ----------------------------------------------------------------------------- the plan, no mlx
def embedded_config():
    return gguf.config_from_header(gguf.read_header(sources.resolve(None).path, tokenizer=False))


def test_a_path_for_one_process_is_refused_for_a_split_model():
    """The quantized and int8 paths run in one process: asked for across ranks, one line says so before any
    file is read (they became bfloat16 without a word)."""

    class TwoRanks:
        def size(self):
            return 2

    for dtype in ("quantized", "int8"):
        with pytest.raises(MlxinferError, match=f"compute_dtype '{dtype}' runs in one process only"):
            mlxinfer.load("/nonexistent", compute_dtype=dtype, group=TwoRanks())


def test_plan_splits_by_groups_of_query_heads():
    """SmolLM2: 9 query heads in 3 KV groups of 3. Two ranks take 2 groups and 1; three take one each;
    four is more ranks than KV heads."""
    cfg = embedded_config()
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (9, 3, 1536)
    two = split.plan(cfg, 2, {"o_proj": 32, "down_proj": 32})
    assert [(s.kv_heads, s.q_heads, s.mlp_columns) for s in two.shares] == [
        ((0, 2), (0, 6), (0, 768)),
        ((2, 3), (6, 9), (768, 1536)),
    ]
    three = split.plan(cfg, 3, {"o_proj": 32, "down_proj": 32})
    assert [s.q_heads for s in three.shares] == [(0, 3), (3, 6), (6, 9)]
    with pytest.raises(MlxinferError, match="4 ranks but the model has 3 key/value heads.*use 2 or 3 ranks"):
        split.plan(cfg, 4)
    # a group of 128 columns: the cut after 6 heads of 64 (column 384) is a whole number of groups,
    # after 3 heads (192, with 3 ranks) it is not
    split.plan(cfg, 2, {"o_proj": 128})
    with pytest.raises(MlxinferError, match="column 192, inside a quantization group of 128 .*; use 2 ranks"):
        split.plan(cfg, 3, {"o_proj": 128})


def test_count_ranks_memory_per_rank():
    """count --ranks 2 --context C on the embedded model: the ranks' weights partition the layers
    (each keeps the embedding whole), the KV cache splits 2:1 like the KV heads, and a token costs
    two all_sums of 576 values per layer."""
    r = mlxinfer.count(None, ranks=2, context=1000).ranks
    one, rows, rep = r["one_process"], r["per_rank"], r["replicated_bytes"]
    assert one["weight_bytes"] == 96_576_768  # the GGUF's tensor bytes (README's quantization table)
    assert sum(x["weight_bytes"] - rep for x in rows) == one["weight_bytes"] - rep
    kv_token = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, 2 bytes
    assert one["kv_cache_bytes"] == kv_token * 1000
    assert [x["kv_cache_bytes"] for x in rows] == [kv_token * 1000 * 2 // 3, kv_token * 1000 // 3]
    assert r["communication"]["bytes_summed_per_token"] == 2 * 30 * 576 * 2
    assert all(x["weight_bytes"] < 0.7 * one["weight_bytes"] for x in rows)
    shown = invoke_cli("count", "--ranks", "2", "--context", "1000")
    assert shown.returncode == 0 and "Split across 2 ranks" in shown.stdout and "60 all_sums of 576" in shown.stdout
    assert_one_line_error(invoke_cli("count", "--ranks", "4"), "4 ranks", "3 key/value heads")


# ----------------------------------------------------------------------------- two ranks = one process
@pytest.fixture(scope="module")
def float32_checkpoint(tmp_path_factory):
    """Tiny checkpoints stored in float32. The seeded texts are compared on the weights as stored, and
    there bf16 or f16 weights round each rank's partial sum before the all_sum (and MLX's CPU
    quantized matmul accumulates in bf16), so on a tiny random model, whose next-token distribution
    is nearly flat, one draw in a few dozen can flip. The embedded model (f16 activations, a real
    distribution) gives the same texts as stored."""
    root, made = tmp_path_factory.mktemp("float32"), {}

    def get(arch: str):
        if arch not in made:
            made[arch] = checkpoints.write_checkpoint(root / arch, arch, dtype=mx.float32, torch_dtype="float32")
        return made[arch]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("which", ["embedded", "llama", "qwen3"])
def test_two_ranks_compute_what_one_process_computes(which, float32_checkpoint, tmp_path):
    """Last-position logits within 1e-4 of one process (float32 path), the same greedy tokens for the
    lesson's prompts, the same seeded sample texts (weights as stored), and each rank holding its share
    of the layers plus the whole embedding and output table: well under the whole model."""
    model = "embedded" if which == "embedded" else str(float32_checkpoint(which))
    worker = str(ROOT / "tests" / "shard_worker.py")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    alone = subprocess.run(
        [sys.executable, worker, model, str(tmp_path / "one")],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert alone.returncode == 0, alone.stderr
    start = time.perf_counter()
    done = launch(worker, model, str(tmp_path / "two"))
    seconds = time.perf_counter() - start
    assert (tmp_path / "two" / "result.json").exists(), done.stderr
    one, two = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("one", "two"))
    assert (one["ranks"], two["ranks"]) == (1, 2)
    for i in range(2):  # the lesson's prompts, float32 path
        a, b = (np.load(tmp_path / d / f"logits_{i}.npy") for d in ("one", "two"))
        diff = float(np.abs(a - b).max())
        print(f"{which}: prompt {i}: max |logit difference| {diff:.2e} over {a.size:,} scores")
        assert diff < 1e-4
    assert two["paths"]["float32"]["greedy"] == one["paths"]["float32"]["greedy"]
    if which != "embedded":  # mlx-lm's class, split by its own shard() through the same hook
        for i in range(2):
            a, b = (np.load(tmp_path / d / f"mlx_lm_logits_{i}.npy") for d in ("one", "two"))
            assert np.abs(a - b).max() < 1e-4
            assert np.abs(a - np.load(tmp_path / "one" / f"logits_{i}.npy")).max() < 1e-4  # and it is our model
    assert two["paths"]["bfloat16"]["sample"] == one["paths"]["bfloat16"]["sample"]
    for path in ("float32", "bfloat16"):
        whole, shares = one["paths"][path], two["paths"][path]["sharding"]["shares"]
        assert two["paths"][path]["sharding"]["one_process_weight_bytes"] == whole["weight_bytes"]
        print(
            f"{which} {path}: one process {whole['weight_bytes']:,} weight bytes ({whole['active_bytes']:,} active); "
            + "; ".join(f"rank {s['rank']} {s['weight_bytes']:,} ({s['active_bytes']:,} active)" for s in shares)
            + f"; launch {seconds:.0f} s"
        )
        for s in shares:  # each rank: its share of the layers plus the whole embedding (and output table)
            assert s["weight_bytes"] < 0.75 * whole["weight_bytes"]
            assert s["active_bytes"] < 0.8 * whole["active_bytes"]
        assert sum(s["weight_bytes"] for s in shares) > whole["weight_bytes"]  # the replicated tables


@pytest.mark.slow
def test_topk_and_generate_tool_under_mlx_launch(checkpoint_dir):
    """Launched on two ranks, topk and generate --tool split the model by themselves; rank 0 alone
    prints (stdout is one JSON document) and says how the model was split."""
    path = str(checkpoint_dir("llama"))
    args = ["topk", "-m", path, "-p", FRUIT, "--rows", "8", "--compute-dtype", "float32", "--json"]
    single = json.loads(invoke_cli(*args).stdout)
    done = launch("-m", "mlxinfer", *args)
    table = json.loads(done.stdout)  # one document: rank 1 printed nothing
    assert table["sharding"]["ranks"] == 2 and single["sharding"] is None
    assert [r["id"] for r in table["rows"]] == [r["id"] for r in single["rows"]]
    assert np.allclose([r["score"] for r in table["rows"]], [r["score"] for r in single["rows"]], atol=1e-4)

    shown = launch("-m", "mlxinfer", *args[:-1])  # as a terminal user sees it: one table, and the split
    assert shown.stdout.count("scores in one pass") == 1 and "split across 2 ranks" in shown.stdout

    tool = str(ROOT / "examples" / "add_to_shopping_list.json")
    args = ["generate", "-p", "Put basil on my shopping list.", "--tool", tool, "--temp", "0", "--max-tokens", "40"]
    single = json.loads(invoke_cli(*args, "--json").stdout)
    result = json.loads(launch("-m", "mlxinfer", *args, "--json").stdout)
    assert result["valid"] and result["text"] == single["text"], (result["text"], single["text"])
    assert [s["q_heads"] for s in result["sharding"]["shares"]] == [[0, 6], [6, 9]]


@pytest.mark.slow
def test_sample_and_sweep_shard_the_model_on_request(float32_checkpoint, tmp_path):
    """--shard-model: every rank runs every seed on its share of the model; the texts are one process's,
    and rank 0 alone writes the sweep's results file."""
    path = str(float32_checkpoint("llama"))
    args = ["-m", path, "--compute-dtype", "bfloat16", "--seeds", "6", "--max-tokens", "5", "--json"]
    single = json.loads(invoke_cli("sample", "-p", FRUIT, *args).stdout)
    report = json.loads(launch("-m", "mlxinfer", "sample", "-p", FRUIT, *args, "--shard-model").stdout)
    assert report["sharding"]["ranks"] == 2
    assert [c["text"] for c in report["completions"]] == [c["text"] for c in single["completions"]]

    out, alone = tmp_path / "split.jsonl", tmp_path / "alone.jsonl"
    assert invoke_cli("sweep", "-p", FRUIT, *args, "--out", str(alone)).returncode == 0
    done = launch("-m", "mlxinfer", "sweep", "-p", FRUIT, *args, "--out", str(out), "--shard-model")
    summary = json.loads(done.stdout)
    assert summary["ranks"] == 2 and summary["sharding"]["ranks"] == 2
    texts = [[json.loads(line)["text"] for line in p.read_text().splitlines()[1:]] for p in (out, alone)]
    assert texts[0] == texts[1] and len(texts[0]) == 6  # one copy of each record: rank 1 wrote nothing


# ----------------------------------------------------------------------------- bad input
def test_an_mlx_lm_class_that_cannot_split_evenly(checkpoint_dir):
    """mlx-lm's shard() needs head counts that divide by the ranks; its ValueError becomes one line."""
    from mlxinfer.model.peers import mlx_lm_twin
    from mlxinfer.model.shard import shard

    class Three:  # what shard() reads of a group: 3 ranks, this one rank 0
        def rank(self):
            return 0

        def size(self):
            return 3

    model, _ = mlxinfer.load(checkpoint_dir("llama"), "float32")
    twin = mlx_lm_twin(model)
    twin.info = model.info
    with pytest.raises(MlxinferError, match="splits only into equal shares.*across 3 devices"):
        shard(twin, Three())


@pytest.mark.slow
def test_more_ranks_than_kv_heads(checkpoint_dir, tmp_path):
    path = str(checkpoint_dir("llama"))  # 4 query heads in 2 KV groups
    for r in spawn([["topk", "-m", path, "-p", FRUIT]] * 3, tmp_path):
        assert_one_line_error(r, "3 ranks but the model has 2 key/value heads", "use 2 ranks")


@pytest.mark.slow
def test_a_split_that_would_cut_a_quantization_group(checkpoint_dir, tmp_path):
    path = str(checkpoint_dir("llama", 4, 128))  # o_proj: 4 heads of 32 = 128 columns, one group
    for r in spawn([["generate", "-m", path, "-p", FRUIT]] * 2, tmp_path):
        assert_one_line_error(r, "o_proj", "column 64", "quantization group of 128", "run it on one rank")
    assert_one_line_error(invoke_cli("count", path, "--ranks", "2"), "quantization group of 128")


@pytest.mark.slow
def test_a_rank_that_cannot_reach_the_others_gives_up(checkpoint_dir, tmp_path):
    """Rank 0 of a ring of 2 whose rank 1 never starts: MLX would wait for ever; here it stops after
    MLXINFER_CONNECT_TIMEOUT seconds."""
    path = str(checkpoint_dir("llama"))
    start = time.perf_counter()
    (r,) = spawn([["topk", "-m", path, "-p", FRUIT]], tmp_path, ranks=2, env={"MLXINFER_CONNECT_TIMEOUT": "2"})
    assert time.perf_counter() - start < 60
    assert_one_line_error(r, "rank 0 could not reach the other ranks within 2 s", "MLXINFER_CONNECT_TIMEOUT")


@pytest.mark.slow
def test_ranks_that_disagree_on_the_model(checkpoint_dir, tmp_path):
    """Same config and tokenizer, other weights on rank 1: both ranks stop before loading; a rank that
    cannot open its model stops the other too."""
    path = str(checkpoint_dir("llama"))
    other = str(checkpoints.write_checkpoint(tmp_path / "other", "llama", seed=1))
    r0, r1 = spawn([["topk", "-m", path, "-p", FRUIT], ["topk", "-m", other, "-p", FRUIT]], tmp_path)
    for r in (r0, r1):
        assert_one_line_error(r, "ranks disagree on the model", "rank 1's weight bytes", "same model")
    r0, r1 = spawn(
        [["topk", "-m", path, "-p", FRUIT], ["topk", "-m", str(tmp_path / "nowhere"), "-p", FRUIT]], tmp_path
    )
    assert_one_line_error(r0, "rank 1 could not open the model")
    assert_one_line_error(r1, "no model at")


@pytest.mark.slow
def test_fewer_seeds_than_ranks_and_standard_input_under_mlx_launch(float32_checkpoint, tmp_path):
    """Was: `sample --seeds 1` on two ranks a traceback on the rank with no seed (max() of nothing); `-p -`
    (and a command given no prompt) waited for ever on the pipe mlx.launch holds open for its ranks."""
    path = str(float32_checkpoint("llama"))
    args = ["-m", path, "--compute-dtype", "bfloat16", "--seeds", "5:6", "--max-tokens", "4", "--json"]
    single = json.loads(invoke_cli("sample", "-p", FRUIT, *args).stdout)
    done = launch("-m", "mlxinfer", "sample", "-p", FRUIT, *args)
    assert "Traceback" not in done.stderr, done.stderr
    assert [c["text"] for c in json.loads(done.stdout)["completions"]] == [c["text"] for c in single["completions"]]
    held = launch("-m", "mlxinfer", "generate", "-m", path, "-p", "-", "--max-tokens", "2", timeout=120)
    assert "mlx.launch keeps open" in held.stderr and "Traceback" not in held.stderr, held.stderr


def test_ranks_given_different_requests_stop_every_rank_with_one_line(checkpoint_dir, tmp_path):
    """Was: a rank given another prompt, --max-tokens or --temps drew its share of the seeds (or took part in a
    split model's passes) with it; rank 0 printed the mixed results, a sweep wrote a file its own --resume then
    refused, and every rank exited 0. The ranks compare their requests first: one line on each, exit 2."""
    path = str(checkpoint_dir("llama"))
    common = ["-m", path, "--seeds", "4", "--max-tokens", "3", "--no-chat"]
    for r in spawn([["sample", "-p", FRUIT, *common], ["sample", "-p", "Name one herb.", *common]], tmp_path):
        assert_one_line_error(r, "ranks disagree on the request", "rank 1's prompt", "same command")
    out = tmp_path / "sweep.jsonl"
    sweep = ["sweep", "-p", FRUIT, "-m", path, "--seeds", "4", "--max-tokens", "3", "--no-chat", "--out", str(out)]
    for r in spawn([[*sweep, "--temps", "1"], [*sweep, "--temps", "0.5,1"]], tmp_path):
        assert_one_line_error(r, "ranks disagree on the request", "settings")
    assert not out.exists() and not list(tmp_path.glob("sweep.jsonl*"))
    split = ["generate", "-p", FRUIT, "-m", path, "--seed", "3", "--no-chat"]  # generate splits the model
    for r in spawn([[*split, "--max-tokens", "3"], [*split, "--max-tokens", "5"]], tmp_path):
        assert_one_line_error(r, "ranks disagree on the request", "max_tokens")


def test_a_rank_that_python_cannot_interrupt_ends_after_ctrl_c(tmp_path):
    """A rank held inside an MLX collective whose peer has gone never returns to Python, so its Ctrl-C is never
    raised and mlx.launch waits with it for ever (seen: a split model's sample, interrupted). The wakeup fd's
    watcher ends such a rank a grace period after the signal, if Python's handler has not run since. Here
    the main thread waits in C (on a mutex it holds: no signal ends that), as one held in a collective does; a
    rank whose Python handles the interrupt and goes on (a library caller) is left alone."""
    script = tmp_path / "held.py"
    script.write_text(
        "import signal, sys, time\n"
        "from mlxinfer.model import distributed\n"
        "distributed._exit_if_stuck(1, grace=1.0)\n"
        "if sys.argv[1] == 'goes-on':\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        end = time.monotonic() + 3\n"
        "        while time.monotonic() < end:\n"
        "            sum(range(1000))  # Python runs: the watcher must not end it\n"
        "        print('went on', flush=True)\n"
        "        sys.exit(0)\n"
        "import ctypes\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        "libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeros\n"
        "libc.pthread_mutex_lock(mutex)\n"
        "print('ready', flush=True)\n"
        "libc.pthread_mutex_lock(mutex)  # held in C for ever, as in a collective: no signal ends the wait\n"
        "sys.exit(0)\n"
    )
    goes_on = subprocess.Popen([sys.executable, str(script), "goes-on"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert goes_on.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # into its sleep
    goes_on.send_signal(2)
    out, err = goes_on.communicate(timeout=30)
    assert goes_on.returncode == 0 and "went on" in out and "still held" not in err, (goes_on.returncode, err)
    for signum, code in ((2, 130), (15, 143)):  # Ctrl-C; SIGTERM where a Python handler hears it (as a sweep's)
        p = subprocess.Popen([sys.executable, str(script), "held"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # into the wait
        started = time.monotonic()
        p.send_signal(signum)
        _, err = p.communicate(timeout=30)
        assert p.returncode == code and 0.9 < time.monotonic() - started < 10, (p.returncode, err)
        assert "rank 1 was still held in a call to MLX 1 s after the signal" in err


def test_a_sweep_on_two_ranks_refuses_an_out_that_one_rank_refuses(checkpoint_dir, tmp_path):
    """Was: two ranks replaced a finished sweep's file (or any file) named by --out without a word, and a folder
    drew every seed, then ended in a traceback leaving part files. Refused before any draw, on every rank."""
    path = str(checkpoint_dir("llama"))
    sweep = ["sweep", "-p", FRUIT, "-m", path, "--temps", "1", "--seeds", "4", "--max-tokens", "3", "--no-chat"]
    held = tmp_path / "held.jsonl"
    assert invoke_cli(*sweep, "--out", str(held)).returncode == 0
    notes = tmp_path / "notes.txt"
    notes.write_text("not a sweep\n")
    before = held.read_bytes()
    refusals = ((held, "already holds results"), (notes, "is not a sweep results file"), (tmp_path, "is not a file"))
    for out, said in refusals:
        for r in spawn([[*sweep, "--out", str(out)]] * 2, tmp_path):
            assert_one_line_error(r, said)
    assert held.read_bytes() == before and notes.read_text() == "not a sweep\n"
    assert not list(tmp_path.glob("*.rank*of*"))


def test_a_resume_on_another_number_of_ranks_is_refused(checkpoint_dir, tmp_path):
    """Was: a sweep stopped on two ranks and resumed on one drew every seed again beside the part files."""
    out = tmp_path / "sweep.jsonl"
    for rank in range(2):
        (tmp_path / f"sweep.jsonl.rank{rank}of2").write_text("")
    sweep = ["sweep", "-p", FRUIT, "-m", str(checkpoint_dir("llama")), "--seeds", "4", "--max-tokens", "3"]
    r = invoke_cli(*sweep, "--out", str(out), "--resume")
    assert_one_line_error(r, "was being written by a run on 2 ranks", "2 hosts in mlx.launch's hostfile")
    assert not out.exists()


def test_a_rank_lost_mid_run_is_one_line(monkeypatch):
    """Was: a peer gone mid-run (a Mac asleep, a rank killed) ended in a traceback from whichever collective
    noticed it."""

    def lost(*args, **kwargs):
        raise RuntimeError("[ring] connection to a peer was lost")

    monkeypatch.setattr(mlxinfer, "sample", lost)
    r = invoke_cli("sample", "-p", FRUIT, "--seeds", "2", "--max-tokens", "2")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: this rank lost the other ranks mid-run ([ring] connection to a peer was lost)")

    def unsupported(*args, **kwargs):
        raise RuntimeError("[ring] Group split not supported.")

    monkeypatch.setattr(mlxinfer, "sample", unsupported)  # MLX's other errors are not a lost peer
    with pytest.raises(RuntimeError, match="Group split"):
        invoke_cli("sample", "-p", FRUIT, "--seeds", "2", "--max-tokens", "2")


def test_a_part_file_one_rank_refuses_stops_both_before_any_draw(checkpoint_dir, tmp_path):
    """Was: a rank whose own part file was refused stopped alone; the other drew its whole share, then ended in
    a lost peer."""
    out = tmp_path / "sweep.jsonl"
    (tmp_path / "sweep.jsonl.rank1of2").write_text("not a sweep\n")
    sweep = ["sweep", "-p", FRUIT, "-m", str(checkpoint_dir("llama")), "--seeds", "4", "--max-tokens", "3"]
    for r in spawn([[*sweep, "--out", str(out)]] * 2, tmp_path):
        assert_one_line_error(r, "sweep.jsonl.rank1of2 is not a sweep results file")
    assert not out.exists() and not (tmp_path / "sweep.jsonl.rank0of2").exists()
