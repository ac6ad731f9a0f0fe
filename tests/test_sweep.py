"""Sweeps: the grid's records equal `sample`'s, the results file survives kills and refuses other
experiments, two ranks under mlx.launch give one process's completions, and bad input is one line."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, assert_one_line_error, free_ports, invoke_cli, start_held

import checkpoints
import mlxinfer
from mlxinfer.engine.summary import wilson

PROMPTS = ["Name one herb.", "Name one fruit."]


@pytest.fixture(scope="module")
def tiny(checkpoint_dir):
    """A 4-bit tiny checkpoint, weights as stored: each row's bits do not depend on its batch."""
    path = checkpoint_dir("llama", 4, 64)
    return str(path), mlxinfer.load(path, compute_dtype="bfloat16")


def cli_sweep(path, out, *extra, seeds="12", batch="4"):
    return [
        "sweep",
        "-m",
        path,
        "--compute-dtype",
        "bfloat16",
        "-p",
        PROMPTS[0],
        "-p",
        PROMPTS[1],
        "--temps",
        "0.8,1.3",
        "--seeds",
        seeds,
        "--max-tokens",
        "6",
        "--batch-size",
        batch,
        "--out",
        str(out),
        *extra,
    ]


def read_records(path):
    lines = path.read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    return header, records


def completions(records):
    return sorted((r["prompt_index"], r["settings_index"], r["seed"], r["text"], tuple(r["tokens"])) for r in records)


@pytest.mark.slow
def test_the_grid_gives_samples_records_and_a_summary_that_adds_up(tiny):
    _, (model, tok) = tiny
    grid = mlxinfer.settings_grid([0.8, 1.3], top_p=[1.0, 0.9])
    assert len(grid) == 4 and {"temperature": 1.3, "top_p": 0.9} in grid
    report = mlxinfer.sweep(model, tok, PROMPTS, settings=grid, seeds="3:11", max_tokens=6, batch_size=3)
    assert report.completions == report.new_completions == 2 * 4 * 8 and report.ranks == 1
    for p, prompt in enumerate(PROMPTS):
        for s, settings in enumerate(grid):
            sampled = mlxinfer.sample(model, tok, prompt, seeds="3:11", settings=settings, max_tokens=6, batch_size=8)
            mine = [r for r in report.records if (r.prompt_index, r.settings_index) == (p, s)]
            assert [(r.seed, r.text, r.tokens) for r in mine] == [
                (c.seed, c.text, c.tokens) for c in sampled.completions
            ]
    for cell in report.cells:
        assert cell.draws == 8 == sum(a.count for a in cell.answers)
        for a in cell.answers:
            assert a.share == a.count / 8 and a.share_low <= a.share <= a.share_high
            assert (a.share_low, a.share_high) == pytest.approx(wilson(a.count, 8))
        if cell.p_value is not None:
            assert 0.0 <= cell.p_value <= 1.0 and cell.dof >= 1


@pytest.mark.slow
def test_first_token_probability_is_the_samplers(tiny):
    """The expected share next to each answer: its first token's probability after temperature and cut,
    as the sampler's own explanation of the first step gives it."""
    _, (model, tok) = tiny
    settings = {"temperature": 1.3, "top_p": 0.9}
    report = mlxinfer.sweep(model, tok, PROMPTS[:1], settings=[settings], seeds=6, max_tokens=2)
    ids = mlxinfer.encode_prompt(tok, PROMPTS[0])
    resolved = mlxinfer.SamplerSettings(**{**mlxinfer.SamplerSettings().to_dict(), **report.records[0].settings})
    logits = mlxinfer.prefill(model, ids).logits
    ex = mlxinfer.explain(logits, resolved, k=model.config.vocab_size, fast=model.info.cpu_kernels)
    final = {row.id: row.final_prob for row in ex.rows}
    for r in report.records:
        assert r.first_token_prob == pytest.approx(final[r.first_token], rel=1e-5)
        assert r.first_token == (r.tokens[0] if r.tokens else r.first_token)


def test_wilson_interval_against_published_values():
    """Wilson (1927) / Newcombe (1998) table 1: 81 of 263 gives 0.2553-0.3662; 0 of 10 gives 0-0.2775."""
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=5e-5)


def test_chi_square_p_value_by_hand():
    """Observed 30/10 against expected 0.5/0.5 of 40: statistic (30-20)^2/20 * 2 = 10, one dof, p = erfc(sqrt(5))."""
    from mlxinfer.engine.summary import first_token_test

    statistic, dof, p = first_token_test({1: 30, 2: 10}, {1: 0.5, 2: 0.5})
    assert (statistic, dof) == (pytest.approx(10.0), 1)
    assert p == pytest.approx(math.erfc(math.sqrt(5.0)), rel=1e-9)
    # float32 probabilities of every token drawn summing a hair under 1: no empty bin of the rest (was: one
    # more degree of freedom, for 3e-8 of mass), whichever side of 1 the rounding falls
    assert first_token_test({1: 30, 2: 10}, {1: 0.5, 2: 0.49999997})[1] == 1
    assert first_token_test({1: 30, 2: 10}, {1: 0.5, 2: 0.50000003})[1] == 1
    # a token drawn where the cut gives it probability 0: rejected (was: its bin dropped, p = 0.58)
    assert first_token_test({1: 120, 2: 75, 3: 5}, {1: 0.6, 2: 0.4, 3: 0.0})[2] == 0.0
    assert first_token_test({1: 3, 3: 1}, {1: 1.0, 3: 0.0})[2] == 0.0  # also where too few draws for a test


# ----------------------------------------------------------------------------- the results file
@pytest.mark.slow
def test_killed_sweep_resumes_to_exactly_an_uninterrupted_run(tiny, tmp_path):
    path, _ = tiny
    whole = tmp_path / "whole.jsonl"
    assert invoke_cli(*cli_sweep(path, whole, "--json")).returncode == 0
    _, expected = read_records(whole)
    assert len(expected) == 2 * 2 * 12

    out = tmp_path / "killed.jsonl"
    # held just after its third synced write (the header, then two batches of two), then killed there
    proc = start_held(*cli_sweep(path, out, "--json", batch="2"), at="synced", target=out, n=3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    _, partial = read_records(out)  # every line parses
    assert completions(partial) == completions(expected)[:4]  # the first cell's first two batches, exactly
    with open(out, "a") as f:  # and a line torn in the middle of a write, as a kill -9 mid-write leaves one
        f.write('{"prompt_index": 1, "settings_index": 0, "se')

    resumed = invoke_cli(*cli_sweep(path, out, "--resume", "--json"))
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["resumed"] == len(partial) and report["new_completions"] == len(expected) - len(partial)
    header, records = read_records(out)
    assert completions(records) == completions(expected)  # nothing lost, nothing twice
    assert len({(r["prompt_index"], r["settings_index"], r["seed"]) for r in records}) == len(records)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_stops_after_the_last_whole_batch(tiny, tmp_path, sig):
    """SIGTERM at a known point, just after the third batch's lines were synced: exit 143 (128 +
    SIGTERM, as a shell reports it; was 130, Ctrl-C's), the three batches kept whole, nothing after them.
    SIGHUP (a closed terminal) the same, 129 (was: killed on the spot, no line)."""
    path, _ = tiny
    out = tmp_path / "term.jsonl"
    proc = start_held(*cli_sweep(path, out, seeds="40", batch="2"), at="synced", target=out, n=4)
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1].startswith("interrupted:") and "--resume" in err
    text = out.read_text()
    assert text.endswith("\n")
    _, records = read_records(out)
    assert len(records) == 3 * 2  # whole batches of two only: the three written before the signal
    assert [r["seed"] for r in records] == list(range(6))


def test_another_experiments_file_is_refused_and_left_alone(tiny, tmp_path):
    path, _ = tiny
    out = tmp_path / "mine.jsonl"
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    before = out.read_bytes()
    other = [a if a != "0.8,1.3" else "0.5" for a in cli_sweep(path, out, "--resume", seeds="2")]
    assert_one_line_error(invoke_cli(*other), "--out", "holds another sweep", "settings")
    assert_one_line_error(invoke_cli(*cli_sweep(path, out, seeds="2")), "already holds results", "--resume")
    assert out.read_bytes() == before
    more = invoke_cli(*cli_sweep(path, out, "--resume", "--json", seeds="4"))  # more seeds extend the same sweep
    assert json.loads(more.stdout)["new_completions"] == 2 * 2 * 2


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--prompts", "EMPTY"], ["--prompts", "holds no prompt"]),
        (["--prompts", "LATIN1"], ["--prompts", "not UTF-8"]),
        (["--prompts", "LONG"], ["LONG line 2: the prompt is", "context"]),  # which line is too long
        (["-p", "hi", "--temps", ""], ["--temps is empty", "no cells"]),
        (["-p", "hi", "--top-p", ""], ["--top-p is empty"]),
        (["-p", "hi", "--batch-size", "0"], ["--batch-size must be"]),
        (["-p", "hi", "--temps", "0.5,-1"], ["--temps must be >= 0"]),  # the grid's flag, not generate's --temp
        (["-p", "hi", "--seed-range", "4:4"], ["--seed-range 4:4 is empty"]),
        ([], ["--prompt", "--prompts"]),
    ],
)
def test_bad_sweep_input(tiny, tmp_path, args, fragments):
    path, _ = tiny
    (tmp_path / "EMPTY").write_text("\n  \n")
    (tmp_path / "LATIN1").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "LONG").write_text("hi\n" + "x " * 20_000 + "\n")
    args = [str(tmp_path / a) if a in ("EMPTY", "LATIN1", "LONG") else a for a in args]
    seeds = [] if "--seed-range" in args else ["--seeds", "2"]
    out = tmp_path / "never.jsonl"
    r = invoke_cli("sweep", "-m", path, *seeds, "--out", str(out), *args)
    assert_one_line_error(r, *fragments)
    assert not out.exists()


def test_resume_needs_out_and_an_empty_out_starts_afresh(tiny, tmp_path):
    path, _ = tiny
    r = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "2", "--max-tokens", "2", "--resume")
    assert_one_line_error(r, "--resume needs --out")  # was: ignored
    out = tmp_path / "touched.jsonl"
    out.touch()  # was: "cannot be written (File exists)"
    r = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "2", "--max-tokens", "2", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 3  # the header and two completions
    # fewer seeds than the file holds: the report is the seeds asked for (it was every record in the file),
    # and the file keeps the others
    r = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "1", "--max-tokens", "2", "--out", str(out),
                   "--resume", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["completions"], report["new_completions"], report["resumed"]) == (1, 0, 1)
    assert report["cells"][0]["draws"] == 1 and len(out.read_text().splitlines()) == 3
    shown = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "1", "--max-tokens", "2", "--out", str(out),
                       "--resume")  # fmt: skip
    assert "(0 new, 1 resumed" in shown.stdout and "none drawn)" in shown.stdout  # was: 0.0 tok/s
    assert "tok/s" not in shown.stdout.splitlines()[0]
    missing = tmp_path / "no" / "such" / "out.jsonl"
    r = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "2", "--max-tokens", "2", "--out", str(missing))
    assert_one_line_error(r, f"the folder {missing.parent} does not exist; create it first")  # was: "(No such file...)"
    assert not (tmp_path / "no").exists()


# ----------------------------------------------------------------------------- across processes
@pytest.mark.slow
def test_two_ranks_give_one_processs_completions(tiny, tmp_path):
    """mlx.launch --backend ring -n 2 on 127.0.0.1: each rank takes every other seed of each cell and
    rank 0 gathers them over mx.distributed into one results file."""
    path, _ = tiny
    single = tmp_path / "single.jsonl"
    assert invoke_cli(*cli_sweep(path, single, seeds="10")).returncode == 0
    launch = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    out = tmp_path / "two.jsonl"
    port = str(free_ports(2))
    done = subprocess.run(
        [
            launch,
            "--backend",
            "ring",
            "-n",
            "2",
            "--hosts",
            "127.0.0.1",
            "--starting-port",
            port,
            "--cwd",
            str(ROOT),
            "--python",
            sys.executable,
            "--",
            "-m",
            "mlxinfer",
            *cli_sweep(path, out, "--json", seeds="10"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), done.stderr[-3000:]  # mlx.launch exits 0 when a rank fails: its words are here
    report = json.loads(done.stdout)  # rank 0 alone prints
    assert report["ranks"] == 2 and report["completions"] == report["new_completions"] == 2 * 2 * 10
    assert completions(read_records(out)[1]) == completions(read_records(single)[1])
    assert not list(tmp_path.glob("two.jsonl.rank*"))  # the parts are merged and gone


@pytest.mark.slow
def test_a_full_disk_keeps_whole_batches_and_resume_finishes(tiny, tmp_path):
    """Was: a write that failed (no space left, a file size limit) was a traceback, and a short write left
    a cut line that --resume then called "edited by hand". Now: one line, exit 1 (the place the output goes
    is at fault, not the input: as for a stdout that cannot be written), the file cut back to its last whole
    batch; --resume with room again gives the uninterrupted run's records."""
    import resource

    path, _ = tiny
    full = tmp_path / "full.jsonl"
    assert invoke_cli(*cli_sweep(path, full)).returncode == 0
    lines = full.read_bytes().splitlines(keepends=True)
    whole = len(lines[0]) + sum(len(line) for line in lines[1:5])  # the header and the first batch of 4
    limit = whole + len(b"".join(lines[5:9])) // 2  # the second batch cannot be written whole

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG) instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "cut.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "mlxinfer", *cli_sweep(path, out)],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=small_files, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --out") and "--resume" in proc.stderr
    assert out.read_bytes() == b"".join(lines[:5])  # whole batches only, no cut line
    resumed = invoke_cli(*cli_sweep(path, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert completions(read_records(out)[1]) == completions(read_records(full)[1])


def test_a_run_that_fails_before_its_first_batch_leaves_no_file(checkpoint_dir, tmp_path):
    """Was: the header alone was left, so the same command, once the model was mended, asked for --resume."""
    bad = checkpoints.corrupt_copy(checkpoint_dir("llama"), tmp_path / "bad")
    out = tmp_path / "never.jsonl"
    for extra in ([], ["--exact"]):  # --exact: the walks run before the draws, after the file is opened
        assert_one_line_error(invoke_cli(*cli_sweep(str(bad), out), *extra), "model.layers.1")
        assert not out.exists()


def test_a_seed_listed_twice_is_refused(tiny, tmp_path):
    """A results file holds one record per prompt, settings and seed: a repeated seed would have been drawn
    twice and kept once (sample's tally counted it twice: refused there too). Nothing is written."""
    path, _ = tiny
    model, tok = mlxinfer.load(path)
    out = tmp_path / "never.jsonl"
    with pytest.raises(mlxinfer.MlxinferError, match="seeds lists 3 more than once") as e:
        mlxinfer.sweep(model, tok, "hi", settings=[{"temperature": 1.0}], seeds=[1, 3, 2, 3], max_tokens=2, out=out)
    assert e.value.params == ("seeds",) and not out.exists()
    with pytest.raises(mlxinfer.MlxinferError, match="seeds lists 3 more than once"):
        mlxinfer.sample(model, tok, "hi", seeds=[3, 3, 3], settings={"temperature": 1.0}, max_tokens=2)


def test_a_prompt_listed_twice_is_refused(tiny, tmp_path):
    """The same prompt twice (-p twice, a prompts file's repeated line) drew the same cells twice and wrote
    their records twice: refused as a repeated seed is, naming the file's lines. Nothing is written."""
    path, _ = tiny
    model, tok = mlxinfer.load(path)
    out = tmp_path / "never.jsonl"
    for prompts in (["hi", "there", "hi"], [[1, 2], [1, 2]]):
        with pytest.raises(mlxinfer.MlxinferError, match="more than once; list each prompt once") as e:
            mlxinfer.sweep(model, tok, prompts, settings=[{"temperature": 1.0}], seeds=2, max_tokens=2, out=out)
        assert e.value.params == ("prompts",) and not out.exists()
    listed = tmp_path / "prompts.txt"
    listed.write_text("hi\n\nthere\nhi\n")
    result = invoke_cli(
        "sweep", "--model", path, "--prompts", str(listed), "--temps", "1", "--seeds", "2", "--out", str(out)
    )
    assert_one_line_error(result, "lines 1 and 4 hold the same prompt")
    assert not out.exists()


def test_a_plain_prompts_file_from_before_texts_continued_resumes_by_its_own_rule(tiny, tmp_path):
    """A --no-chat results file written before a plain prompt's texts kept their first token's leading space
    (its header has no "continues") resumed as "edited by hand": every record's text lacked the space the
    replay now gives. It resumes, and the records it adds follow its rule; a new file says "continues". (With
    logit_bias in the settings, which no sweep could resume: the header's token ids read back as strings.)"""
    path, _ = tiny
    model, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    out = tmp_path / "plain.jsonl"
    word = next(i for i in range(300) if tok.decode([i]).startswith(" ") and tok.decode([i]).strip().isalpha())
    setting = {"temperature": 1.0, "logit_bias": {word: 100.0}}  # each text opens with a space-led word
    run = dict(settings=[setting], max_tokens=3, chat=False, out=out)
    mlxinfer.sweep(model, tok, "The cat", seeds=[0, 1], **run)
    header, *records = [json.loads(x) for x in out.read_text().splitlines()]
    assert header.pop("continues") is True
    texts = {r["seed"]: r["text"] for r in records}
    old = [header] + [{**r, "text": r["text"][1:] if r["text"].startswith(" ") else r["text"]} for r in records]
    out.write_text("".join(json.dumps(x) + "\n" for x in old))
    mlxinfer.sweep(model, tok, "The cat", seeds=[0, 1, 2], resume=True, **run)
    header2, *records2 = [json.loads(x) for x in out.read_text().splitlines()]
    assert "continues" not in header2 and len(records2) == 3
    now = mlxinfer.sample(model, tok, "The cat", seeds=[2], chat=False, settings=setting, max_tokens=3)
    added = next(r for r in records2 if r["seed"] == 2)
    assert added["tokens"] == now.completions[0].tokens
    assert added["text"] == now.completions[0].text.removeprefix(" ")  # the file's rule: the first space dropped
    assert any(t.startswith(" ") for t in texts.values()), texts  # the rule mattered to this file


def test_rank_0s_failure_reaches_every_rank_as_its_own_kind(monkeypatch):
    """A split model's rank 0 fails to open the results file; every other rank raises the same error, of
    the same class, so every rank exits alike (a full disk: 1, bad input: 2)."""
    from mlxinfer.engine import ranks

    class Rank:
        def __init__(self, rank):
            self.r = rank

        def size(self):
            return 2

        def rank(self):
            return self.r

    for failure in (mlxinfer.OutputError("results.jsonl: no space left on the disk", "out"),
                    mlxinfer.MlxinferError("results.jsonl holds another experiment", "out")):  # fmt: skip
        sent = []
        monkeypatch.setattr(ranks, "gather", lambda rows, group, sent=sent: sent.extend(rows) or list(sent))
        with pytest.raises(mlxinfer.MlxinferError) as on_rank0:
            ranks.from_rank0([], Rank(0), failure)
        with pytest.raises(mlxinfer.MlxinferError) as on_rank1:
            ranks.from_rank0([], Rank(1))
        assert type(on_rank1.value) is type(failure) and on_rank1.value.exit_code == failure.exit_code
        assert str(on_rank1.value) == str(on_rank0.value) and on_rank1.value.params == failure.params


def test_a_results_file_edited_into_two_of_one_record_or_an_unknown_field_is_refused_before_any_draw(tiny, tmp_path):
    """Was: a record with a field no record has was read, every missing draw made and appended, then a TypeError
    traceback; a second record of one (prompt, settings, seed) was read and the last one counted."""
    path, _ = tiny
    out = tmp_path / "r.jsonl"
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    header, records = read_records(out)
    for name, edited, fragment in [
        ("extra", records[:2] + [{**records[2], "note": "x"}] + records[3:], 'a field no record has, "note"'),
        ("twice", records + [{**records[1], "seed": records[0]["seed"], "settings_index": 0}], "repeats line"),
    ]:
        bad = tmp_path / f"{name}.jsonl"
        bad.write_text("".join(json.dumps(r) + "\n" for r in [header, *edited]))
        before = bad.read_bytes()
        assert_one_line_error(invoke_cli(*cli_sweep(path, bad, "--resume", seeds="3")), fragment)
        assert bad.read_bytes() == before


def test_a_file_is_written_by_one_sweep_at_a_time(tiny, tmp_path):
    """Was: two runs on one --out each appended their batches, the records twice. While one holds the file
    another is refused; once it ends (or closes), the file resumes."""
    from mlxinfer.engine.results import ResultsFile

    path, _ = tiny
    out = tmp_path / "r.jsonl"
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    header = json.loads(out.read_text().splitlines()[0])
    header.pop("format")
    held = ResultsFile(out, header, resume=True)
    before = out.read_bytes()
    assert_one_line_error(invoke_cli(*cli_sweep(path, out, "--resume", seeds="3")), "being written by another sweep")
    assert out.read_bytes() == before
    held.close()
    assert invoke_cli(*cli_sweep(path, out, "--resume", seeds="3")).returncode == 0


def test_two_runs_starting_one_new_file_and_a_file_that_cannot_be_written(tiny, tmp_path, monkeypatch):
    """Two runs created one new --out at once: the loser said "cannot be written (File exists)", or the file
    got two headers. A results file that cannot be written where a torn line or a header alone must be cut
    was a traceback; it is the one line an append gives."""
    import errno

    from mlxinfer import MlxinferError
    from mlxinfer.engine import results
    from mlxinfer.engine.results import ResultsFile

    path, _ = tiny
    out = tmp_path / "r.jsonl"
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    header = json.loads(out.read_text().splitlines()[0])
    header.pop("format")
    race = ResultsFile(tmp_path / "new.jsonl", header, resume=False, lock=False)
    with pytest.raises(MlxinferError, match="being written by another sweep"):  # a second creation of the file
        race._write_lines([race.header], create=True)
    created = ResultsFile(tmp_path / "held.jsonl", header, resume=False)  # locked from its creation on
    with pytest.raises(MlxinferError, match="being written by another sweep"):
        created._hold("out")  # any other run
    created.close()

    def refused(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    with out.open("ab") as f:
        f.write(b'{"torn": ')
    monkeypatch.setattr(results, "open", refused, raising=False)  # the cut of the torn line
    with pytest.raises(MlxinferError, match=r"cannot be written \(Read-only file system\); write to another file"):
        ResultsFile(out, header, resume=True)
    monkeypatch.undo()
    out.write_text(json.dumps({"format": results.FORMAT, **header}) + "\n")  # a header alone: cut to start again
    monkeypatch.setattr(results.os, "truncate", refused)
    with pytest.raises(MlxinferError, match=r"cannot be written \(Read-only file system\)"):
        ResultsFile(out, header, resume=False)


def test_a_hangup_stops_a_sweep_unless_it_is_ignored():
    """SIGHUP stops a sweep as SIGTERM does, but under nohup (SIGHUP ignored) it stays ignored."""
    from mlxinfer.engine.results import stop_cleanly_on_sigterm

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_cleanly_on_sigterm():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # was: replaced, so nohup's sweep stopped
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with stop_cleanly_on_sigterm():
            assert callable(signal.getsignal(signal.SIGHUP))
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_header_alone_left_by_a_kill_is_no_result_to_resume(tiny, tmp_path):
    """A run killed before its first batch leaves the header only: the same command runs again without
    --resume (it said the file "already holds results")."""
    path, _ = tiny
    out = tmp_path / "r.jsonl"
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    want = out.read_bytes()
    out.write_bytes(want.splitlines(keepends=True)[0])
    assert invoke_cli(*cli_sweep(path, out, seeds="2")).returncode == 0
    assert out.read_bytes() == want


def test_a_file_that_is_no_sweeps_is_named_so_with_or_without_resume(tiny, tmp_path):
    """Was: without --resume, '--out FILE already holds results; pass --resume', and with it 'is not a sweep
    results file': a typo's --out prompts.txt sent the user to --resume for nothing."""
    path, _ = tiny
    for i, content in enumerate([b'{"a": 1}\n', b"\n", b"\xff\xfe not text\n", b"Name one fruit.\n"]):
        out = tmp_path / f"not{i}.jsonl"
        out.write_bytes(content)
        for resume in ((), ("--resume",)):
            shown = invoke_cli(*cli_sweep(path, out, *resume, seeds="2"))
            assert_one_line_error(shown, "--out", "is not a sweep results file", "write to another file")
        assert out.read_bytes() == content


def test_an_exact_sweeps_walk_and_stop_strings_are_part_of_what_a_resume_must_match(tiny, tmp_path):
    """exact_prob depends on the grouping and the walk's bounds, and the texts on the stop strings: a resume
    with other ones, or without them, would mix records of two experiments in one file."""
    path, _ = tiny
    out = tmp_path / "r.jsonl"
    exact = ["--exact", "--group", "text", "--max-nodes", "20"]
    assert invoke_cli(*cli_sweep(path, out, *exact, seeds="2")).returncode == 0
    before = out.read_bytes()
    # a time bound too (was: a resume with --max-seconds 0.3 then 3 wrote two probabilities for one answer in one cell)
    timed = [*exact, "--max-seconds", "30"]
    for changed in (["--exact", "--group", "first-word", "--max-nodes", "20"], [], ["--stop", "x", *exact], timed):
        result = invoke_cli(*cli_sweep(path, out, "--resume", *changed, seeds="3"))
        assert_one_line_error(result, "holds another sweep")
        assert out.read_bytes() == before
    assert invoke_cli(*cli_sweep(path, out, "--resume", *exact, seeds="3")).returncode == 0


def test_a_sweep_too_large_to_list_is_refused_before_anything_is_built(tiny, tmp_path):
    """Was: 100 temperatures x 99 top-p x 100 top-k (990,000 cells), or 10,000 prompts x 4 temperatures x 100,000
    seeds, ran for minutes with nothing printed while memory grew past 7 GB (the grid and the list of pending draws
    are built before the first draw). Both are one line naming the sizes, and no results file."""
    path, _ = tiny
    values = ",".join(f"{0.01 * (i + 1):.2f}" for i in range(100))
    top_ks = ",".join(str(k) for k in range(1, 101))
    out = tmp_path / "grid.jsonl"
    grid = invoke_cli("sweep", "-m", path, "-p", "hi", "--temps", values, "--top-p", values, "--top-k", top_ks,
                      "--seeds", "1", "--max-tokens", "1", "--out", str(out))  # fmt: skip
    assert_one_line_error(
        grid, "the grid would have 1,000,000 settings cells (100 --temps x 100 --top-p x 100 --top-k)"
    )
    with pytest.raises(mlxinfer.MlxinferError, match="at most 10,000"):
        mlxinfer.settings_grid(list(range(1, 101)), top_k=list(range(1, 102)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"word {i}\n" for i in range(2_000)))
    many = invoke_cli("sweep", "-m", path, "--prompts", str(prompts), "--temps", "0.5,1", "--seeds", "300",
                      "--max-tokens", "1", "--out", str(out))  # fmt: skip
    assert_one_line_error(many, "the sweep would draw 1,200,000 completions (2,000 prompts x 2 settings x 300 --seeds)")
    assert not out.exists()


def test_an_out_that_is_a_dangling_link_says_so(tiny, tmp_path):
    """Was: 'cannot be written (File exists)', for a link whose target does not exist."""
    path, _ = tiny
    link = tmp_path / "results.jsonl"
    link.symlink_to(tmp_path / "gone" / "results.jsonl")
    r = invoke_cli("sweep", "-m", path, "-p", "hi", "--seeds", "2", "--max-tokens", "2", "--out", str(link))
    assert_one_line_error(r, f"--out {link} is a link to {tmp_path / 'gone' / 'results.jsonl'}, which does not exist")
    assert link.is_symlink() and not (tmp_path / "gone").exists()
