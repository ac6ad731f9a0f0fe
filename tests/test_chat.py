"""`mlxinfer chat` and mlxinfer.ChatSession: the conversation, its seeds, its slash commands, at a real terminal."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
from conftest import ROOT, assert_one_line_error, run_cli
from terminal import Terminal

import mlxinfer

FRUIT = "Name one fruit. Answer with one word."
MORE = "And one more?"


def test_the_second_turn_reads_the_first(embedded_quantized):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=6, seed=3)
    first = session.reply(FRUIT)
    reply = "".join(first)
    second = session.reply(MORE)
    "".join(second)
    conversation = [
        {"role": "user", "content": FRUIT},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": MORE},
    ]
    # the second reply's prompt is the template's rendering of all three messages, nothing else
    assert second.stream.request.ids == mlxinfer.encode_prompt(tok, conversation)
    assert second.record.prompt_tokens > first.record.prompt_tokens + len(tok.encode(reply, add_special_tokens=False))
    assert [m["content"] for m in session.messages] == [FRUIT, reply, MORE, second.record.text]
    assert [t.seed for t in session.turns] == [3, 3]


def test_one_reply_open_at_a_time_and_a_reply_left_part_way_is_kept(embedded_quantized):
    """A second reply while one is being written is refused (it would answer a conversation that lacks
    the first); a loop left part-way keeps what was written, as stop() does; an ended reply is not
    iterated again; a reply never read is dropped by the next."""
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=8, seed=3)
    unread = session.reply(FRUIT)
    first = session.reply(FRUIT)
    with pytest.raises(mlxinfer.MlxinferError, match="dropped unread"):
        list(unread)
    pieces = iter(first)
    piece = next(pieces)
    with pytest.raises(mlxinfer.MlxinferError, match="still being written"):
        session.reply(MORE)
    pieces.close()  # what leaving a for loop with break does, once the iterator is let go
    assert (first.record.text, first.record.finish_reason) == (piece, "interrupted")
    assert session.messages == [{"role": "user", "content": FRUIT}, {"role": "assistant", "content": piece}]
    with pytest.raises(mlxinfer.MlxinferError, match="has ended"):
        list(first)
    whole = "".join(session.reply(MORE))
    assert [m["content"] for m in session.messages] == [FRUIT, piece, MORE, whole]
    with pytest.raises(mlxinfer.MlxinferError, match="model must be the model load"):
        mlxinfer.ChatSession((model, tok), tok)


def test_a_seeded_reply_is_generate_with_that_seed(embedded_quantized):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=8, settings={"temperature": 1.0})
    "".join(session.reply(FRUIT))
    second = session.reply(MORE)
    text = "".join(second)
    assert {t.seed for t in session.turns} != {None}
    again = mlxinfer.generate(model, tok, second.messages, seed=second.seed, max_tokens=8, settings={"temperature": 1})
    assert again.text == text == second.record.text


def test_a_reply_ends_before_a_stop_string_as_generate_does(embedded_quantized, tmp_path):
    """stop ends each reply where generate with the same seed and stop ends (the string left out, finish_reason
    'stop'), and the kept message is that text; from the CLI too (--stop)."""
    model, tok = embedded_quantized
    whole = mlxinfer.ChatSession(model, tok, max_tokens=12, seed=7, settings={"temperature": 1.0}).reply(FRUIT)
    full = "".join(whole)
    cut = full[len(full) // 2 :].strip()[:3]  # a piece from the reply's second half
    assert cut and full.find(cut) > 0
    session = mlxinfer.ChatSession(model, tok, max_tokens=12, seed=7, settings={"temperature": 1.0}, stop=[cut])
    text = "".join(session.reply(FRUIT))
    assert text == full[: full.find(cut)] and session.turns[0].finish_reason == "stop"
    assert session.messages[-1]["content"] == text and session.to_dict()["stop"] == [cut]
    again = mlxinfer.generate(model, tok, FRUIT, seed=7, max_tokens=12, settings={"temperature": 1.0}, stop=cut)
    assert again.text == text
    with pytest.raises(mlxinfer.MlxinferError, match="stop must be"):
        mlxinfer.ChatSession(model, tok, stop=[""])
    args = ["chat", "--seed", "7", "--temp", "1", "--max-tokens", "12", "--stop", cut, "--json"]
    env = {**os.environ, "MLXINFER_CHAT_HISTORY": str(tmp_path / "history")}
    r = subprocess.run([sys.executable, "-m", "mlxinfer", *args], input=FRUIT + "\n", capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["text"] == text


def test_fresh_seeds_per_reply_unless_fixed(embedded_quantized):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=1)
    seeds = set()
    for _ in range(4):
        turn = session.reply(FRUIT)
        list(turn)
        seeds.add(turn.seed)
        session.command("/reset")
    assert len(seeds) == 4  # drawn from 2**32: four equal by chance is ~1e-28
    assert session.command("/seed 11").kind == "set"
    assert [session.reply(FRUIT).seed for _ in range(2)] == [11, 11]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("/temp -1", "/temp -1: temperature must be >= 0"),
        ("/temp hot", "/temp takes a number"),
        ("/top-p 1.5", "top_p must be in (0, 1]"),
        ("/top-k 2.5", "/top-k takes a whole number"),
        ("/seed -4", "/seed takes a whole number"),
        ("/save", "/save takes a file name"),
        ("/topk", "say something first"),
        ("/tmep 1", "did you mean /temp?"),
        ("/system \udcff", "/system takes UTF-8 text"),  # was: kept; every reply and /save then failed
    ],
)
def test_bad_commands_are_refused_and_change_nothing(embedded_quantized, line, fragment):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, settings={"temperature": 0.5}, seed=2)
    outcome = session.command(line)
    assert outcome.kind == "error" and fragment in outcome.message, outcome.message
    assert "\n" not in outcome.message
    assert (session.settings, session.seed) == ({"temperature": 0.5}, 2)


def test_commands_set_what_they_say(embedded_quantized):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=2)
    for line in ("/temp 0", "/top-p 0.9", "/top-k 20", "/min-p 0.05", "/repetition-penalty 1.1", "/penalty-window 64"):
        assert session.command(line).kind == "set"
    assert session.settings == {
        "temperature": 0.0, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "penalty_window": 64
    }  # fmt: skip
    # back to the default (a window of all, no longer expressible as a number); -1 reads as the flag does
    assert session.command("/penalty-window").kind == "set" and "penalty_window" not in session.settings
    assert session.command("/top-k -1").kind == "set" and session.settings["top_k"] == 0
    assert session.command("/top-k \u0663").kind == "error"  # an Arabic-Indic 3: int() reads it, the flag would not
    session.command("/top-k 20")
    session.command("/penalty-window 64")
    # every numeric sampler setting with a flag has its command, named by the flag (one declaration)
    options = mlxinfer.SamplerSettings.options()
    flagged = {"/" + o.flags.split()[0][2:] for o in options if o.flags and o.kind in (int, float)}
    assert flagged <= set(mlxinfer.engine.chat.COMMANDS) and "/typical-p" in flagged
    session.command("/system Be brief.")
    turn = session.reply(FRUIT)
    list(turn)
    assert turn.stream.request.ids == mlxinfer.encode_prompt(tok, FRUIT, system="Be brief.")
    table = session.command("/topk 4").data
    # the table is the next token after that same prompt: its top row is the greedy reply's first token
    assert table.prompt_ids == turn.stream.request.ids and len(table.rows) == 4
    assert table.rows[0].id == turn.stream.result.tokens[0]
    assert session.command("/reset").kind == "reset" and session.messages == [] and session.settings


def test_save_writes_the_conversation_as_json(embedded_quantized, tmp_path):
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=3, seed=5)
    list(session.reply(FRUIT))
    out = tmp_path / "chat.json"
    assert session.command(f"/save {out}").kind == "saved"
    saved = json.loads(out.read_text())
    assert saved["messages"] == session.messages and saved["turns"][0]["seed"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json"]  # no temporary file left
    refused = session.command(f"/save {tmp_path / 'missing' / 'chat.json'}")
    assert refused.kind == "error" and "pick a writable path" in refused.message
    # a save replaces an earlier one, keeping its mode; any other file is kept (was: replaced, made 0644)
    os.chmod(out, 0o600)
    list(session.reply("And another?"))
    assert session.command(f"/save {out}").kind == "saved"
    assert json.loads(out.read_text())["messages"] == session.messages and stat.S_IMODE(out.stat().st_mode) == 0o600
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    refused = session.command(f"/save {notes}")
    assert refused.kind == "error" and "exists and is not a saved chat" in refused.message
    assert notes.read_text() == "my notes\n"


def test_save_writes_through_a_link_and_never_replaces_a_device_or_a_pipe(embedded_quantized, tmp_path):
    """Was: `/save /dev/full` (run as root) replaced the device with a JSON file, and a symbolic link was
    replaced by a file, its target left as it was. A pipe stands in for the device (no root needed)."""
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=2, seed=1)
    list(session.reply(FRUIT))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    refused = session.command(f"/save {pipe}")
    assert refused.kind == "error" and "a device, a pipe or a socket, not a regular file" in refused.message
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text(json.dumps({"messages": [], "turns": []}))  # an earlier save
    link.symlink_to(target)
    assert session.command(f"/save {link}").kind == "saved"
    assert link.is_symlink() and json.loads(target.read_text())["messages"] == session.messages


@pytest.mark.slow
def test_chat_at_a_terminal(embedded_quantized, tmp_path):
    """Two turns at a pseudo-terminal: each reply equals `mlxinfer generate` with its seed and conversation;
    a bad /temp is one line and the chat goes on; /save writes JSON; /quit leaves with exit 0."""
    env = {"MLXINFER_CHAT_HISTORY": str(tmp_path / "history"), "TERM": "xterm"}
    term = Terminal("chat", "--max-tokens", "6", "--seed", "7", cwd=str(ROOT), env=env)
    try:
        term.expect(r">>> ")
        term.send(FRUIT + "\n")
        first = term.expect(r"\[seed 7\][^\n]*\n(.*?)\n>>> ").group(1).decode()
        term.send(MORE + "\n")
        second = term.expect(r"\[seed 7\]\n(.*?)\n>>> ").group(1).decode()
        term.send("/temp -1\n")
        refused = term.expect(r"(error: [^\n]*)\n>>> ").group(1).decode()
        assert refused.startswith("error: /temp -1: temperature must be >= 0"), refused
        out = tmp_path / "chat.json"
        term.send(f"/save {out}\n")
        term.expect(r"saved 4 messages")
        term.send("/quit\n")
        assert term.wait() == 0
    finally:
        term.close()
    saved = json.loads(out.read_text())
    assert [m["content"] for m in saved["messages"]] == [FRUIT, first, MORE, second]
    assert FRUIT in (tmp_path / "history").read_text()  # readline's history, kept for the next chat

    one = run_cli("generate", "-p", FRUIT, "--seed", "7", "--max-tokens", "6")
    assert one.returncode == 0 and one.stdout.rstrip("\n") == first
    # the second reply from the rendered conversation, control tokens read as such
    session = mlxinfer.ChatSession(*embedded_quantized)
    rendered = session.prompt_text(saved["messages"][:3])
    two = run_cli("generate", "--no-chat", "--raw-special-tokens", "-p", rendered, "--seed", "7", "--max-tokens", "6")
    assert two.returncode == 0 and two.stdout.rstrip("\n") == second
    # and from the /save file itself, its last reply dropped (was: only through Python, as above)
    refused = run_cli("generate", "--messages", str(out), "--seed", "7", "--max-tokens", "6")
    assert_one_line_error(refused, "ends with the assistant's reply", "drop that reply")
    saved["messages"] = saved["messages"][:3]
    (tmp_path / "turn2.json").write_text(json.dumps(saved))
    again = run_cli("generate", "--messages", str(tmp_path / "turn2.json"), "--seed", "7", "--max-tokens", "6")
    assert again.returncode == 0 and again.stdout.rstrip("\n") == second
    as_list = tmp_path / "turn2-list.json"  # OpenAI's shape: the messages alone
    as_list.write_text(json.dumps(saved["messages"]))
    table = run_cli("topk", "--messages", str(as_list), "--json")
    assert json.loads(table.stdout)["prompt_ids"] == session.prompt_ids(saved["messages"])
    both = run_cli("topk", "--messages", str(as_list), "-p", "hi")
    assert_one_line_error(both, "-p, --prompt-file or --messages: one of them")
    plain = run_cli("tokens", "--messages", str(as_list), "--no-chat")  # was: the library's chat=True, after the load
    assert_one_line_error(plain, "--messages is a conversation", "drop --no-chat")


@pytest.mark.slow
def test_ctrl_c_stops_the_reply_not_the_chat(tmp_path):
    env = {"MLXINFER_CHAT_HISTORY": str(tmp_path / "history"), "TERM": "xterm"}
    term = Terminal("chat", "--max-tokens", "2000", "--temp", "0", cwd=str(ROOT), env=env)
    try:
        term.expect(r">>> ")
        term.send("Write a long story about a dragon who learns to bake bread.\n")
        term.expect(r"sampling: [^\n]*\n\S")  # the reply has begun (greedy: its settings' note, no seed)
        term.send("\x03")
        term.expect(r"\[stopped\]\n>>> ", timeout=30)
        out = tmp_path / "chat.json"
        term.send(f"/save {out}\n")
        term.expect(r"saved 2 messages[^\n]*\n>>> ")  # readline reads again (a Ctrl-D before is no EOF)
        term.send("\x04")  # Ctrl-D at the prompt leaves
        assert term.wait() == 0
    finally:
        term.close()
    turn = json.loads(out.read_text())["turns"][0]
    assert turn["finish_reason"] == "interrupted" and 0 < turn["generated_tokens"] < 2000
    assert re.search(r"\w", turn["text"])


@pytest.mark.parametrize("end", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_chat_json_prints_one_object_a_line(tmp_path, end):
    """Was: chat --json printed each reply as indented JSON over many lines, so a pipe could not read it
    line by line. Each reply and command is one line; a reply equals `generate` with its seed. Lines of a
    file saved with CRLF endings are the same lines (was: the message kept its "\r", "/temp 0.5\r" was refused)."""
    lines = f"{FRUIT}{end}/temp 0.5{end}"
    env = {"MLXINFER_CHAT_HISTORY": str(tmp_path / "history")}
    proc = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "chat", "--json", "--max-tokens", "4", "--seed", "7"],
        input=lines, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 2, proc.stdout
    reply, command = (json.loads(line) for line in out)
    assert command["command"] == "/temp" and command["data"] == {"temperature": 0.5}
    one = run_cli("generate", "-p", FRUIT, "--seed", "7", "--max-tokens", "4")
    assert reply["user"] == FRUIT and reply["text"] == one.stdout.rstrip("\n")


def test_a_piped_chat_keeps_its_json_in_step_and_exits_2_for_refused_lines(tmp_path):
    """Was: a line that was not UTF-8 (or a message refused) printed nothing on stdout under --json, so a script
    reading a line of JSON per line fell out of step; /system took such bytes and /save then ended in a
    traceback; the chat exited 0; a line without end (/dev/zero) was read whole, gigabytes."""
    env = {**os.environ, "MLXINFER_CHAT_HISTORY": str(tmp_path / "history")}
    saved = tmp_path / "chat.json"
    lines = f"/system \xff\n\xfe\n{FRUIT}\n/save {saved}\n".encode("latin-1")
    proc = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "chat", "--json", "--max-tokens", "3", "--seed", "7"],
        input=lines, capture_output=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [o.get("kind") for o in out] == ["error", "error", None, "saved"], out
    assert proc.returncode == 2 and "Traceback" not in proc.stderr.decode()
    assert proc.stderr.decode().rstrip().endswith("error: 2 lines of the conversation failed (said above)")
    assert json.loads(saved.read_text())["messages"][0] == {"role": "user", "content": FRUIT}
    endless = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "chat", "--max-tokens", "3"],
        input=b"x" * (16 << 20 | 1), capture_output=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    said = endless.stderr.decode().splitlines()  # the banner, the error, the count
    assert endless.returncode == 2 and said[1].startswith("error: a line of standard input is over 16,777,216")
    assert len(said) == 3 and endless.stdout == b""


def test_a_reply_budget_past_the_context_is_refused_before_the_chat_opens(embedded_quantized, tmp_path):
    """Was: `chat --max-tokens 100000` printed its banner, then an error for every message, and exited 0."""
    model, tok = embedded_quantized
    one_word = tok.apply_chat_template([{"role": "user", "content": "?"}], add_generation_prompt=True)
    room = model.config.max_position_embeddings - len(one_word)
    mlxinfer.ChatSession(model, tok, max_tokens=room)  # the largest budget a one-word message leaves
    with pytest.raises(mlxinfer.MlxinferError, match=f"lower it to at most {room:,}"):
        mlxinfer.ChatSession(model, tok, max_tokens=room + 1)
    env = {**os.environ, "MLXINFER_CHAT_HISTORY": str(tmp_path / "history")}
    proc = subprocess.run([sys.executable, "-m", "mlxinfer", "chat", "--max-tokens", "100000"], input="hello\n",
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: --max-tokens 100,000 leaves no room")


def test_a_reply_says_which_settings_it_ran_with(tmp_path):
    """Was: a reply's JSON said "settings": {} and the terminal said nothing, so a learner could not tell which
    temperature wrote a reply. Each record holds every sampler field it ran with and where they came from (the
    note `generate` prints); at the terminal the note goes before the first reply and again when it changes."""
    lines = f"{FRUIT}\n/temp 0.5\n{MORE}\n{MORE}\n/temp 0\n{MORE}\n"
    env = {**os.environ, "MLXINFER_CHAT_HISTORY": str(tmp_path / "history")}
    run = [sys.executable, "-m", "mlxinfer", "chat", "--max-tokens", "2", "--top-k", "40"]
    shown = subprocess.run(run, input=lines, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    seeds = [line for line in shown.stderr.splitlines() if line.startswith("[seed ")]
    assert len(seeds) == 3, shown.stderr
    assert "sampling: top_k 40 set by you" in seeds[0] and "temperature" not in seeds[0], seeds
    assert "temperature 0.5" in seeds[1] and "top_k 40" in seeds[1], seeds
    assert re.fullmatch(r"\[seed \d+\]", seeds[2]), seeds
    # a greedy reply draws nothing: its note alone (was: a fresh "[seed N]" for each, as if it mattered)
    last = shown.stderr.splitlines()[-1]
    assert re.fullmatch(r"sampling: top_k 40, temperature 0\.0 set by you; .*", last), shown.stderr
    records = subprocess.run(run + ["--json"], input=lines, capture_output=True, text=True, cwd=ROOT, env=env,
                             timeout=300)  # fmt: skip
    replies = [json.loads(line) for line in records.stdout.splitlines() if '"user"' in line]
    assert [r["settings"]["temperature"] for r in replies] == [1.0, 0.5, 0.5, 0.0]
    assert [r["seed"] is None for r in replies] == [False, False, False, True]
    assert all(r["settings"]["top_k"] == 40 and r["settings"]["top_p"] == 1.0 for r in replies)
    assert replies[0]["settings_note"] == seeds[0].split("] ", 1)[1]


def test_a_conversation_grown_past_the_context_names_reset(embedded_quantized):
    """Was: 'shorten the prompt' alone, where what grew past the context is the conversation: /reset starts a new
    one. A first message too long on its own gets no such advice (a new conversation would not help)."""
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, max_tokens=2)
    with pytest.raises(mlxinfer.MlxinferError) as alone:
        session.reply("hello " * 9000)
    assert "context" in str(alone.value) and "/reset" not in str(alone.value)
    session.messages = [{"role": "user", "content": "hello " * 5000}, {"role": "assistant", "content": "hi " * 5000}]
    with pytest.raises(mlxinfer.MlxinferError, match=r"context is 8,192; .*; or /reset starts a new conversation"):
        session.reply("and now?")
    assert len(session.messages) == 2  # unchanged
