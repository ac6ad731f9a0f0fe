"""A sweep's results file: JSON Lines, a header line that says which experiment it holds, then
one line per completion, appended and flushed a batch at a time.

What survives: a batch's lines go out in one write and are synced before the next batch starts,
so an interruption (Ctrl-C, kill) loses at most the batch in flight. SIGTERM is turned into the
same clean stop as Ctrl-C while a sweep runs; a line torn by a harder kill (a power cut, kill -9
in the middle of a write) is cut off when the file is next opened to resume, so every line a
reader sees parses. A file that holds another experiment (another model, prompt set, settings,
token budget or chat setup) is refused, never overwritten.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import threading
from contextlib import contextmanager, suppress
from dataclasses import MISSING, fields
from pathlib import Path

from .. import atomic
from ..errors import MlxinferError, OutputError, is_whole
from ..views import SweepRecord

FORMAT = "mlxinfer-sweep/1"
RECORD_FIELDS = [f.name for f in fields(SweepRecord) if f.default is MISSING]  # exact_prob: an exact sweep's only
ALL_FIELDS = {f.name for f in fields(SweepRecord)}


def record_key(record: dict) -> tuple[int, int, int]:
    return record["prompt_index"], record["settings_index"], record["seed"]


def _whole(value, low: int, high: int) -> bool:
    return is_whole(value) and low <= value < high


def record_problem(record, header: dict) -> str | None:
    """What is wrong with a record read back for the experiment `header` describes (None: nothing):
    every field of views.SweepRecord present, of its type, in its range, and agreeing with the header."""
    if not isinstance(record, dict):
        return "it is not a JSON object"
    missing = [k for k in RECORD_FIELDS if k not in record]
    if missing:
        return f"it has no {missing[0]}"
    extra = [k for k in record if k not in ALL_FIELDS]
    if extra:  # was: every draw made and appended, then a TypeError traceback building the report
        return f"it has a field no record has, {_shown(extra[0])}"
    prompts, settings = header.get("prompts") or [], header.get("settings") or []
    hashes = header.get("prompt_sha256") or []
    vocab, most = (header.get("model") or {}).get("vocab_size") or 0, header.get("max_tokens") or 0
    p, s, tokens, prob = record["prompt_index"], record["settings_index"], record["tokens"], record["first_token_prob"]
    checks = {
        "prompt_index": (_whole(p, 0, len(prompts)), f"a whole number from 0 to {len(prompts) - 1}"),
        "settings_index": (_whole(s, 0, len(settings)), f"a whole number from 0 to {len(settings) - 1}"),
        "seed": (_whole(record["seed"], 0, 2**63), "a whole number from 0 to 2**63 - 1"),
        "text": (isinstance(record["text"], str), "a string"),
        "finish_reason": (record["finish_reason"] in ("stop", "length"), '"stop" or "length"'),
        "tokens": (
            isinstance(tokens, list) and len(tokens) <= most and all(_whole(t, 0, vocab) for t in tokens),
            f"a list of at most {most} token ids below {vocab:,}",
        ),
        "first_token": (_whole(record["first_token"], -1, vocab), f"a token id below {vocab:,}, or -1"),
        "first_token_prob": (_probability(prob), "a probability from 0 to 1"),
        "exact_prob": (record.get("exact_prob") is None or _probability(record["exact_prob"]), "a probability or null"),
    }
    for name, (ok, want) in checks.items():
        if not ok:
            return f"its {name} is {_shown(record.get(name))}, not {want}"
    if record["prompt"] != prompts[p] or p >= len(hashes) or record["prompt_sha256"] != hashes[p]:
        return f"its prompt is not prompt {p} of the header"
    if record["settings"] != settings[s]:
        return f"its settings are not settings {s} of the header"
    if tokens and record["first_token"] != tokens[0]:
        return f"its first_token is {record['first_token']}, not its first token {tokens[0]}"
    return None


def _probability(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0  # NaN fails


def _shown(value) -> str:
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."


class ResultsFile:
    """Open (or create) `path` for the experiment `header` describes; `done` holds what it already has."""

    def __init__(self, path: str | os.PathLike, header: dict, resume: bool, param: str = "out", lock: bool = True):
        """lock: hold the file for this run (another run on it is refused until this one ends or `close`s)."""
        self.path = Path(path).expanduser()
        self.header = {"format": FORMAT, **header}
        self.done: dict[tuple[int, int, int], dict] = {}
        self.created = self.appended = False
        self.texts_fresh = False  # written before a plain prompt's texts continued it: resume keeps that rule
        self._lock: int | None = None
        _check_is_file(self.path, param)
        if lock and self.path.is_file():
            self._hold(param)
        try:
            self._open(resume, param, lock)
        except BaseException:
            self.close()
            raise

    def _open(self, resume: bool, param: str, lock: bool) -> None:
        if self.path.is_file() and not resume and self._header_only():  # left by a run killed before its first
            with self._writing(param):  # batch: no results, so nothing to resume
                os.truncate(self.path, 0)
        exists = self.path.is_file() and self.path.stat().st_size > 0
        if exists and not resume:
            _refuse_held(self.path, param)
        if exists:
            self._read(param)
        else:  # a new file, or an empty one (touched by hand, or left by a run killed at once)
            self.created = not self.path.exists()
            if not self.created and self._lock is not None and self.path.stat().st_size > 0:
                raise self._taken(param)  # another run wrote its header between the look and the lock
            self._write_lines([self.header], create=self.created, param=param, hold=lock)
            if lock and self._lock is None:
                self._hold(param)

    def _hold(self, param: str) -> None:
        """An exclusive lock on the file for as long as this run has it open: two runs appending to one file
        interleaved their batches (the records twice)."""
        import fcntl

        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise self._taken(param) from None
        self._lock = fd

    @property
    def shown(self) -> str:
        return _shown_path(self.path)

    def _taken(self, param: str) -> MlxinferError:
        return MlxinferError(
            f"{param} {self.shown} is being written by another sweep; wait for it to end, or write to another file",
            param,
        )

    @contextmanager
    def _writing(self, param: str):
        """An OSError of a write to the file (read-only, a read-only place) as the one line appends give."""
        try:
            yield
        except OSError as e:
            raise OutputError.of(e)(
                f"{param} {self.shown} cannot be written ({e.strerror}); write to another file", param
            ) from None

    def close(self) -> None:
        """Let go of the file's lock (a process's end does too)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _header_only(self) -> bool:
        return _header_only(self.path)

    def _read(self, param: str) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        lines = data[:end].splitlines()
        stored = _header_of(data)
        if stored is None:
            raise MlxinferError(f"{param} {self.shown} is not a sweep results file; write to another file", param)
        self.texts_fresh = "continues" in self.header and "continues" not in stored
        same_anyway = ("seeds", "continues") if self.texts_fresh else ("seeds",)
        want = json.loads(json.dumps(self.header))  # as the file holds it: logit_bias's token ids as strings
        # both ways: a field only the file has (stop strings, an exact sweep's) is a difference too
        differs = [k for k in {**want, **stored} if k not in same_anyway and stored.get(k) != want.get(k)]
        if differs:
            raise MlxinferError(
                f"{param} {self.shown} holds another sweep (its {differs[0]!r} field differs); "
                "write to another file or run with that sweep's options",
                param,
            )
        done, where = {}, {}
        for n, line in enumerate(lines[1:], start=2):  # every line checked before anything is written
            if not line.strip():  # a blank line (an editor's, or `echo >>`) holds no record
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            wrong = "it is not JSON" if record is None else record_problem(record, want)
            if not wrong and record_key(record) in where:  # was: the last one counted, the earlier one lost
                p, s, seed = record_key(record)
                wrong = f"it repeats line {where[record_key(record)]}'s prompt {p}, settings {s} and seed {seed}"
            if wrong:
                raise MlxinferError(
                    f"{param} {self.shown}: line {n} is not a completion record of this sweep ({wrong}); the file was "
                    "edited by hand: mend or delete that line",
                    param,
                )
            done[record_key(record)] = record
            where[record_key(record)] = n
        self.done.update(done)
        if end < len(data):  # a line torn by a kill in the middle of a write: the batch it belonged to is redone
            with self._writing(param), open(self.path, "r+b") as f:
                f.truncate(end)

    def append(self, records: list[dict]) -> None:
        """All of a batch's lines in one write, synced: a reader never sees half a batch's line."""
        self._write_lines(records)
        self.appended = True
        for r in records:
            self.done[record_key(r)] = r

    def discard_if_unused(self) -> None:
        """A run that failed before its first batch leaves no file it created (a header alone would make
        the same command ask for --resume)."""
        if self.created and not self.appended:
            self.path.unlink(missing_ok=True)

    def _write_lines(self, rows: list[dict], create: bool = False, param: str = "out", hold: bool = False) -> None:
        """rows appended in one write, synced. create: the file is new (O_EXCL); hold: it is locked for this run
        before anything is written, so that no other run can take it between its creation and its header."""
        data = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows).encode()
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if isinstance(e, FileExistsError) and not Path(self.path).is_symlink():
                raise self._taken(param) from None  # created by another run since this one looked
            folder = Path(self.path).parent
            if folder.exists() and not folder.is_dir():
                raise MlxinferError(
                    f"{param} {self.shown}: {folder} is a file, not a folder; write elsewhere", param
                ) from None
            if not folder.is_dir():  # a sweep writes its one file, not the folders to it (convert makes its folder)
                raise MlxinferError(
                    f"{param} {self.shown}: the folder {folder} does not exist; create it first or write elsewhere",
                    param,
                ) from None
            if Path(self.path).is_symlink() and not Path(self.path).exists():  # O_EXCL refuses any link: say which
                raise MlxinferError(
                    f"{param} {self.shown} is a link to {os.readlink(self.path)}, which does not exist; write to the "
                    "file itself, or remove the link",
                    param,
                ) from None
            raise OutputError.of(e)(
                f"{param} {self.shown} cannot be written ({e.strerror}); write to another file", param
            ) from None
        try:
            if create and hold and self._lock is None:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else holds it yet
                self._lock = os.dup(fd)  # the lock lives as long as this descriptor of the same open file
            before = os.fstat(fd).st_size
            view = memoryview(data)
            try:
                while view:  # a short write (a nearly full disk) goes on where it stopped, or fails below
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as e:
                with suppress(OSError):
                    os.ftruncate(fd, before)  # no cut line: the file holds whole batches only
                then = (  # records kept (read back, or appended by this run): resume goes on from them
                    "its whole batches are kept: resume continues once the file can grow"
                    if self.done
                    else "write elsewhere"
                )
                raise OutputError.of(e)(
                    f"{param} {self.shown} cannot be written ({e.strerror}); {then}", param, "resume"
                ) from None
        finally:
            os.close(fd)


def write_whole(path: str | os.PathLike, header: dict, records: list[dict]) -> None:
    """The merged results of several ranks: written beside the target, then renamed over it."""
    lines = [{"format": FORMAT, **header}, *records]
    with atomic.staged_file(Path(path).expanduser()) as tmp:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in lines))


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C; exit_code is the shell's 128 + signal (Ctrl-C's is 130)."""

    def __init__(self, exit_code: int):
        super().__init__(exit_code)
        self.exit_code = exit_code


@contextmanager
def stop_cleanly_on_sigterm():
    """While a sweep runs, SIGTERM (and SIGHUP) stops it the way Ctrl-C does (KeyboardInterrupt), so the batch in
    flight is dropped and nothing after the last synced batch is written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated(128 + signum)

    hangup = getattr(signal, "SIGHUP", None)  # a closed terminal or ssh session: the same clean stop, unless
    ignored = hangup is None or signal.getsignal(hangup) == signal.SIG_IGN  # ignored (nohup): then it runs on
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, None if ignored else hangup) if sig}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_target(path: str | os.PathLike, resume: bool, param: str = "out") -> None:
    """What opening `path` as a ResultsFile would refuse, checked without opening it: the file rank 0 writes
    whole at the end of a run on several ranks (was: replaced without a word, a folder a traceback after the
    run). resume: the file is read as the results so far, so it may hold some."""
    path = Path(path).expanduser()
    _check_is_file(path, param)
    if not resume and path.is_file() and path.stat().st_size > 0 and not _header_only(path):
        _refuse_held(path, param)


def check_parts(out, ranks: int, resume: bool) -> None:
    """A resume reads the part files of a run on as many ranks: those of a run on another number would be passed
    over without a word (was: their draws done again, the files left behind)."""
    if not resume:
        return
    path = Path(out).expanduser()
    pattern = re.compile(re.escape(path.name) + r"\.rank\d+of(\d+)")
    names = (f.name for f in path.parent.glob(glob.escape(path.name) + ".rank*of*"))
    found = {int(m.group(1)) for name in names if (m := pattern.fullmatch(name))}
    other = min(found - {ranks}, default=None)
    if other is not None:
        raise MlxinferError(
            f"out {_shown_path(path)} was being written by a run on {other} ranks (its part files "
            f"{path.name}.rank0of{other}, ...): resume it on {other} ranks ({other} hosts in mlx.launch's hostfile, or "
            f"-n {other} on one machine), or delete those files to draw their seeds again",
            "out",
            "resume",
        )


def _check_is_file(path: Path, param: str) -> None:
    if path.exists() and not path.is_file():
        raise MlxinferError(f"{param} {_shown_path(path)} is not a file; choose a .jsonl path", param)


def _refuse_held(path: Path, param: str) -> None:
    """A file that holds something, written to without resume: another sweep's results, or not a results file."""
    if _header_of(_first_line(path)) is None:  # a typo's --out prompts.txt: not --resume (_read says so)
        raise MlxinferError(f"{param} {_shown_path(path)} is not a sweep results file; write to another file", param)
    raise MlxinferError(
        f"{param} {_shown_path(path)} already holds results; pass resume to continue that sweep, "
        "or write to another file",
        param,
        "resume",
    )


def _shown_path(path: Path) -> str:
    """The path in a message: a bare name as ./name, so that a file called `resume` is not read as the flag."""
    text = str(path)
    return text if path.is_absolute() or path.parent != Path(".") else f".{os.sep}{text}"


def _header_only(path: Path) -> bool:
    """The file holds a header alone (left by a run killed before its first batch): nothing to resume."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    return data.count(b"\n") == 1 and data.endswith(b"\n") and _header_of(data) is not None


def _header_of(data: bytes) -> dict | None:
    """A results file's first line as its header, or None where it is not one (not JSON, another format, cut)."""
    first, newline, _ = data.partition(b"\n")
    try:
        stored = json.loads(first) if newline else None
    except (ValueError, RecursionError):
        return None
    return stored if isinstance(stored, dict) and stored.get("format") == FORMAT else None


def _first_line(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.readline()
