"""The explorer page in a real browser: Debian's Chromium driven by playwright, against one server on the
embedded model (the quantized path: batch-invariant, so a seed's text is the same in any batch).

What the page shows is held to what the CLI prints for the same request: the next-token table to
`topk --json` (ids, and scores and probabilities to the printed precision), the slider's temperature
to `topk --temps`, the cut to `topk --explain`, the whole answers and each one's token paths to
`answers --json`, eight seeded draws and a generation to the command lines the page offers to copy,
run here through the CLI. The slider makes no request; markup typed into the prompt stays text;
without the key the page asks for it. Screenshots of each view (light and dark, 1280 x 800 and a
phone's 390 x 844) go under the pytest tmp dir, with the page's size, first paint and requests per
interaction (metrics.json). One server and one browser for the module; the CLI's references run in
this process while the engine is idle.

Without Chromium or playwright the tests skip; with CI set they fail (`make setup` installs both).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

import mlxinfer
from conftest import invoke_cli
from mlxinfer.server.answers import MAX_SECONDS
from test_serve import running

HERB = "Name one herb to add to tomato soup. Answer with one word."
FRUIT = "Name one fruit. Answer with one word."
KEY = "explorer-test-key"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SIZES = {"1280": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}


def missing(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the browser tests (make setup installs chromium and playwright)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        missing("chromium is not installed (make setup, or apt-get install chromium)")
    pw = sync_playwright().start()
    try:
        launched = pw.chromium.launch(executable_path=executable, args=FLAGS)  # a fresh profile each launch
    except Exception as e:  # noqa: BLE001 - the browser would not start here: say why
        pw.stop()
        missing(f"chromium did not start: {str(e).splitlines()[0]}")
    yield launched
    launched.close()
    pw.stop()


@pytest.fixture(scope="module")
def server(embedded_quantized):
    app = mlxinfer.create_app(*embedded_quantized, max_rows=8, api_key=KEY)
    with running(app) as url:
        yield url


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = tmp_path_factory.mktemp("explorer-screens")
    print(f"explorer screenshots: {out}")
    return out


@pytest.fixture(scope="module")
def metrics(shots):
    found: dict = {"requests": {}}
    yield found
    (shots / "metrics.json").write_text(json.dumps(found, indent=2))


class Tab:
    """One page in its own context, its requests, dialogs and script errors recorded."""

    def __init__(self, browser, url: str, key: bool = True, size: str = "1280"):
        self.context = browser.new_context(viewport=SIZES[size], color_scheme="light")
        self.page = self.context.new_page()
        self.requests: list[tuple[str, str]] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append((r.method, r.url)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = url
        self.page.goto(f"{url}/" + (f"#key={KEY}" if key else ""))
        if key:
            self.page.wait_for_selector("body[data-ready=true]", timeout=60_000)

    def posts(self, path: str) -> int:
        return sum(1 for m, u in self.requests if m == "POST" and u == f"{self.url}{path}")

    def type_prompt(self, text: str) -> None:
        box = self.page.locator("#prompt")
        box.fill("")
        box.press_sequentially(text)

    def cells(self, selector: str) -> list[list[str]]:
        return self.page.eval_on_selector_all(selector, "rows => rows.map(r => [...r.cells].map(c => c.textContent))")

    def shoot(self, shots, name: str) -> None:
        """The view at 1280 x 800 and at a phone's width, light and dark; then back as it was."""
        for size, viewport in SIZES.items():
            self.page.set_viewport_size(viewport)
            for scheme in ("light", "dark"):
                self.page.emulate_media(color_scheme=scheme)
                self.page.screenshot(path=str(shots / f"{name}-{size}-{scheme}.png"), full_page=size == "phone")
        self.page.set_viewport_size(SIZES["1280"])
        self.page.emulate_media(color_scheme="light")

    def close(self) -> None:
        assert self.errors == []
        self.context.close()


def cli_json(*args: str) -> dict:
    r = invoke_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def draw(page, n: int) -> None:
    """Draw, and wait until all n rows have ended."""
    page.click("#draw-run")
    ended = "() => [...document.querySelectorAll('#draw-table .col-end')].filter(c => c.textContent).length"
    page.wait_for_function(f"{ended} === {n}", timeout=120_000)


def run_copied(command: str) -> dict:
    """A command line the page offers to copy, run through the CLI (as a user pasting it would)."""
    words = shlex.split(command)
    assert words[0] == "mlxinfer"
    return cli_json(*words[1:])


def test_next_token_table_slider_and_cut_match_topk(browser, server, shots, metrics):
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(HERB)
    page.click("#next-run")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('scored')", timeout=120_000)
    assert tab.posts("/mlxinfer/next-token") == 1
    metrics["requests"]["next token"] = 1
    want = cli_json("topk", "--prompt", HERB, "--rows", "10", "--temps", "1,0.5", "--compute-dtype", "quantized")
    rows = tab.cells("#next-table tbody tr")
    assert [int(r[2]) for r in rows] == [r["id"] for r in want["rows"]]
    assert [r[1] for r in rows] == [repr(r["text"]) for r in want["rows"]]
    assert [r[3] for r in rows] == [f"{r['score']:.2f}" for r in want["rows"]]
    assert [(r[4], r[5]) for r in rows] == [(f"{r['probs'][0]:.3f}", f"{r['probs'][1]:.3f}") for r in want["rows"]]
    foot = tab.cells("#next-table tfoot tr")[0]
    assert (foot[4], foot[5]) == (f"{want['mass'][0]:.3f}", f"{want['mass'][1]:.3f}")
    assert page.text_content("#next-prompt") == repr(HERB)
    tab.shoot(shots, "next")

    before = len(tab.requests)
    page.focus("#temp-range")
    for _ in range(10):  # the keyboard moves the slider: 1.0 -> 1.5 in steps of 0.05
        page.keyboard.press("ArrowRight")
    assert page.input_value("#temp") == "1.5"
    assert page.text_content("#next-th-p1") == "p @ T=1.5"
    hot = cli_json("topk", "--prompt", HERB, "--rows", "10", "--temps", "1.5", "--compute-dtype", "quantized")
    assert [r[4] for r in tab.cells("#next-table tbody tr")] == [f"{r['probs'][0]:.3f}" for r in hot["rows"]]

    page.fill("#top-p", "0.9")
    page.fill("#top-k", "40")
    cut = cli_json(
        "topk", "--prompt", HERB, "--rows", "10", "--explain", "--temp", "1.5", "--top-p", "0.9", "--top-k", "40",
        "--compute-dtype", "quantized",
    )["explanation"]  # fmt: skip
    rows = tab.cells("#next-table tbody tr")
    assert [r[6] for r in rows] == ["yes" if r["kept"] else "cut" for r in cut["rows"]]
    assert [r[7] for r in rows] == [f"{r['final_prob']:.3f}" if r["kept"] else "" for r in cut["rows"]]
    assert f"keeps {cut['n_kept']:,} of {cut['vocab_size']:,} tokens" in page.text_content("#next-cut")
    assert len(tab.requests) == before  # the slider and the cut re-drew from the scores already here
    metrics["requests"]["temperature slider, ten steps, and two cuts"] = 0
    tab.shoot(shots, "next-cut")
    tab.close()


def test_eight_seeded_draws_match_sample_and_come_back_alone(browser, server, shots, metrics):
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(HERB)
    page.focus("#tab-next")
    page.keyboard.press("ArrowRight")  # the tabs, by keyboard: whole answers, then the draws
    assert page.get_attribute("#tab-answers", "aria-selected") == "true" and page.is_visible("#ans-run")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#tab-draws", "aria-selected") == "true" and page.is_visible("#draw-run")
    page.fill("#draw-n", "8")
    page.fill("#draw-base", "0")
    page.fill("#draw-max", "5")
    draw(page, 8)
    assert tab.posts("/v1/chat/completions") == 2  # eight rows, two requests: one takes half the server's 8 rows
    command = page.text_content("#draw-cli")
    assert "--seeds 0:8" in command and "--max-tokens 5" in command
    report = run_copied(command)
    rows = tab.cells("#draw-table tbody tr")
    assert [int(r[0]) for r in rows] == list(range(8))
    assert [r[1] for r in rows] == [repr(c["text"]) for c in report["completions"]]
    assert [r[2] for r in rows] == [c["finish_reason"] for c in report["completions"]]
    tally = tab.cells("#tally-table tbody tr")
    assert [(r[0], int(r[1]), r[2]) for r in tally] == [
        (repr(t["answer"]), t["count"], f"{t['share']:.1%}") for t in report["tally"]
    ]
    for r in tally:  # each share inside its own 95% interval
        lo, hi = (float(x.rstrip("%")) for x in r[3].split(" – "))
        assert lo <= float(r[2].rstrip("%")) <= hi
    page.select_option("#draw-group", "text")  # the whole text as the answer: the tally regroups, no request
    assert "--group text" in page.text_content("#draw-cli")
    by_text = run_copied(page.text_content("#draw-cli"))
    assert [(r[0], int(r[1])) for r in tab.cells("#tally-table tbody tr")] == [
        (repr(t["answer"]), t["count"]) for t in by_text["tally"]
    ]
    assert tab.posts("/v1/chat/completions") == 2
    page.select_option("#draw-group", "first-word")

    page.click("#draw-table tr[data-seed='3'] button")
    page.wait_for_selector("#draw-table tr[data-seed='3'] .col-alone.same", timeout=60_000)
    assert tab.posts("/v1/chat/completions") == 3
    metrics["requests"]["draw 8 seeds"] = 2
    metrics["requests"]["draw one seed again"] = 1
    tab.shoot(shots, "draws")

    page.fill("#draw-n", "20")  # past a request's rows (half the server's 8): ceil(20 / 4) requests, batched together
    draw(page, 20)
    assert tab.posts("/v1/chat/completions") == 3 + 5
    more = run_copied(page.text_content("#draw-cli"))
    assert [r[1] for r in tab.cells("#draw-table tbody tr")] == [repr(c["text"]) for c in more["completions"]]
    metrics["requests"]["draw 20 seeds"] = 5
    tab.close()


def test_whole_answers_match_answers_and_show_each_path(browser, server, shots, metrics):
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(HERB)
    page.click("#tab-answers")
    page.fill("#ans-temps", "0.5,1")
    page.fill("#ans-max", "2")
    page.fill("#ans-nodes", "40")  # a batch of 32 first tokens, then 8 more: a capped walk, quick on a CPU
    page.click("#ans-run")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('walked')", timeout=120_000)
    assert tab.posts("/mlxinfer/answers") == 1  # the server walks step by step; the page asks once
    metrics["requests"]["whole answers"] = 1
    command = page.text_content("#ans-cli")
    assert "--temps 0.5,1" in command and "--max-tokens 2" in command and "--max-nodes 40" in command
    assert f"--max-seconds {MAX_SECONDS:g}" in command  # the server's time budget travels too
    assert "--batch-size 32" in command  # and its paths a pass (the CLI's default is 64): the same walk
    assert "--temp " not in command  # the sampler's T is not a column: the cut alone applies to both
    report = run_copied(command)
    assert report["stopped"] == "max_nodes" and report["nodes"] == 40
    shown = report["answers"][:20]
    rows = tab.cells("#ans-table tbody tr")
    assert len(rows) == len(shown) >= 2
    assert [r[0] for r in rows] == [repr(a["answer"]) for a in shown]
    assert [r[1:3] for r in rows] == [[f"{p:.4f}" for p in a["probs"]] for a in shown]
    assert [r[3] for r in rows] == [repr("|".join(a["paths"][0]["pieces"])) for a in shown]
    foot = {r[0]: r[1:3] for r in tab.cells("#ans-table tfoot tr")}
    assert foot["(not walked: remainder)"] == [f"{m['remainder']:.4f}" for m in report["mass"]]
    assert foot["explored"] == [f"{m['explored']:.4f}" for m in report["mass"]]
    rest = report["answers"][20:]
    if rest:
        more = foot[f"({len(rest):,} more answers)"]
        assert more == [f"{sum(a['probs'][i] for a in rest):.4f}" for i in range(2)]
    assert "stopped: max_nodes" in page.text_content("#ans-head")
    assert "max nodes (40 paths expanded)" in page.text_content("#ans-bound")

    page.focus("#ans-table tbody tr:nth-child(2) button.answer")  # an answer by keyboard: its paths
    page.keyboard.press("Enter")
    answer = report["answers"][1]
    assert page.get_attribute("#ans-table tbody tr:nth-child(2) button.answer", "aria-expanded") == "true"
    assert page.locator("#ans-path table.path").count() == len(answer["paths"])
    for k, path in enumerate(answer["paths"]):
        steps = tab.cells(f"#ans-path table.path[data-path='{k}'] tbody tr")
        assert [r[1] for r in steps] == [repr(piece) for piece in path["pieces"]]
        assert [int(r[2]) for r in steps] == path["tokens"]
        assert [r[3:5] for r in steps] == [[f"{q:.4f}" for q in step] for step in path["steps"]]
        (whole,) = tab.cells(f"#ans-path table.path[data-path='{k}'] tfoot tr")
        assert whole[3:5] == [f"{q:.4f}" for q in path["probs"]]
    page.click("#ans-table tbody tr:nth-child(1) td.col-p")  # or by a click anywhere on its row
    assert page.get_attribute("#ans-table tbody tr:nth-child(1)", "class") == "chosen"
    first = report["answers"][0]["paths"][0]
    steps = tab.cells("#ans-path table.path[data-path='0'] tbody tr")
    assert [r[3:5] for r in steps] == [[f"{q:.4f}" for q in step] for step in first["steps"]]
    assert tab.posts("/mlxinfer/answers") == 1  # choosing an answer asks nothing
    tab.shoot(shots, "answers")
    page.locator("#ans-path").scroll_into_view_if_needed()
    tab.shoot(shots, "answers-path")
    tab.close()


def test_generation_streams_shaded_and_its_snippets_say_the_same(browser, server, shots, metrics):
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(HERB)
    page.click("#tab-generate")
    page.fill("#gen-seed", "7")
    page.fill("#gen-max", "12")
    page.click("#gen-run")
    page.wait_for_function("() => document.querySelector('#gen-head').textContent.includes('finish:')", timeout=120_000)
    assert tab.posts("/v1/chat/completions") == 1
    metrics["requests"]["generate"] = 1
    text = page.text_content("#gen-text")
    head = page.text_content("#gen-head")
    assert head.startswith("seed 7 · ")
    cli = run_copied(page.text_content("#gen-cli"))
    assert cli["seed"] == 7 and text == cli["text"]
    steps = tab.cells("#gen-tokens tbody tr")
    assert len(steps) == len(cli["tokens"]) == int(head.split(" · ")[1].split()[0])
    assert [r[3] for r in steps] == [f"{s['logprob']:.3f}" for s in cli["steps"] if s["token"] is not None]
    shades = page.eval_on_selector_all(
        "#gen-text span", "s => s.map(x => [Number(x.dataset.p), getComputedStyle(x).backgroundColor])"
    )
    assert shades and all(0 < p <= 1 for p, _ in shades)
    least = min(shades)[1]  # the least likely piece is shaded, an almost certain one barely
    assert least != "rgba(0, 0, 0, 0)" and least != max(shades)[1]

    env = {**os.environ, "MLXINFER_API_KEY": KEY}
    python = subprocess.run([sys.executable, "-c", page.text_content("#gen-python")], env=env, capture_output=True)
    assert python.returncode == 0, python.stderr
    assert python.stdout.decode() == text + "\n"
    if shutil.which("curl"):
        curl = subprocess.run(["bash", "-c", page.text_content("#gen-curl")], env=env, capture_output=True)
        assert json.loads(curl.stdout)["choices"][0]["message"]["content"] == text
    tab.shoot(shots, "generate")
    tab.close()


def test_markup_typed_into_the_prompt_stays_text(browser, server, shots):
    tab = Tab(browser, server)
    page = tab.page
    hostile = "<img src=x onerror=alert(1)>"
    tab.type_prompt(hostile)
    page.fill("#system", "<script>alert(2)</script>")
    page.focus("#prompt")
    page.keyboard.press("Control+Enter")  # runs the view on show: the next token
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('scored')", timeout=120_000)
    assert tab.dialogs == []
    assert page.eval_on_selector_all("img, script:not([src])", "nodes => nodes.length") == 0
    assert page.text_content("#next-prompt") == repr(hostile)
    tab.shoot(shots, "markup")
    page.click("#tab-generate")  # the command lines quote it as text too
    assert hostile in page.text_content("#gen-cli") and "<script>alert(2)</script>" in page.text_content("#gen-cli")
    assert tab.dialogs == [] and page.eval_on_selector_all("img, script:not([src])", "nodes => nodes.length") == 0
    tab.close()


def test_without_the_key_the_page_asks_for_it(browser, server, shots):
    tab = Tab(browser, server, key=False)
    page = tab.page
    page.wait_for_selector("#key-form:not([hidden])", timeout=60_000)
    assert "no model card" in page.text_content("#card")
    page.click("#run")  # was: nothing happened, and nothing said why
    assert "enter the server's API key first" in page.text_content("#error")
    page.fill("#key", "wrong")
    with page.expect_response(f"{server}/mlxinfer/card") as answer:
        page.keyboard.press("Enter")
    assert answer.value.status == 401
    assert page.is_visible("#key-form") and page.get_attribute("body", "data-ready") is None
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('refused this key')")
    page.fill("#key", KEY)
    page.keyboard.press("Enter")
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    assert page.is_hidden("#key-form") and "SmolLM2" in page.text_content("#card")
    cards = [u for m, u in tab.requests if u.endswith("/mlxinfer/card")]
    assert len(cards) == 3  # without the key, with the wrong one, with the right one
    tab.close()


def test_the_page_loads_its_own_files_only(browser, server, shots, metrics):
    """A fresh load: every request goes to this server; its size, its first paint and its requests."""
    tab = Tab(browser, server)
    page = tab.page
    assert all(u.startswith(server) for _, u in tab.requests)
    loaded = page.evaluate(
        """() => {
          const nav = performance.getEntriesByType('navigation')[0];
          const files = [nav, ...performance.getEntriesByType('resource')];
          const paint = Object.fromEntries(performance.getEntriesByType('paint').map(p => [p.name, p.startTime]));
          return {
            files: files.map(f => [f.name.replace(location.origin, ''), f.encodedBodySize]),
            first_paint_ms: paint['first-paint'], first_contentful_paint_ms: paint['first-contentful-paint'],
            dom_content_loaded_ms: nav.domContentLoadedEventEnd,
          };
        }"""
    )
    page_bytes = sum(size for name, size in loaded["files"] if not name.startswith("/mlxinfer/"))
    metrics["page"] = {**loaded, "page_bytes_without_the_card": page_bytes, "requests_on_load": len(tab.requests)}
    assert loaded["first_contentful_paint_ms"] is not None
    assert len(tab.requests) == len(loaded["files"])  # nothing requested that the page did not name
    tab.close()


def test_the_page_groups_answers_by_samples_rule(browser, server):
    """The page's answerKey (static/sampler.js) against engine/grouping.py's answer_key, on texts where
    case folding, punctuation, inner apostrophes and hyphens, digits and wordless texts matter."""
    from mlxinfer.engine.grouping import answer_key

    texts = ["Basil", " basil.", "BASIL, of course", "Straße", "STRASSE", "you're", "Rosé-wine!", "42 apples",
             "...", "", "  \n", "_under_score", "Ελληνικά", "ǅemal", "ﬁne", "Λόγος.", "ΣΑΣ"]  # fmt: skip
    tab = Tab(browser, server)
    keys = tab.page.evaluate(
        "async (texts) => { const m = await import('/explorer/sampler.js');"
        " return texts.map((t) => [m.answerKey(t, 'first-word'), m.answerKey(t, 'text')]); }",
        texts,
    )
    assert keys == [[answer_key(t, None, "first-word"), answer_key(t, None, "text")] for t in texts]
    tab.close()


def test_bad_values_and_failed_runs_say_so_and_again_asks_what_was_drawn(browser, server):
    """Was: 0 rows silently 10; a typed seed of -3 silently replaced by a random one; 10,000 seeds froze the
    tab; a run the server refused left "writing..." for ever; "again" redrew with the controls as they were
    changed since."""
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(HERB)
    page.click("#next-run")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('scored')")
    for rows in ("0", "-5", "2.5"):  # was: silently the default 10 rows
        page.fill("#rows", rows)
        page.click("#next-run")
        assert "rows must be a whole number >= 1" in page.text_content("#error")
        assert page.text_content("#status") == ""  # was: the last run's "scored in ..." beside the error
    assert tab.posts("/mlxinfer/next-token") == 1  # the good run's alone
    page.click("#tab-generate")
    for seed in ("-3", "1.5"):
        page.fill("#gen-seed", seed)
        page.click("#gen-run")
        assert "seed must be a whole number" in page.text_content("#error")
    assert tab.posts("/v1/chat/completions") == 0
    page.fill("#gen-seed", "7")
    page.fill("#gen-max", "999999999")  # past the context: the server's 400
    page.click("#gen-run")
    page.wait_for_function("() => document.querySelector('#gen-head').textContent.endsWith('failed')", timeout=60_000)
    assert not page.is_disabled("#gen-run") and page.is_disabled("#gen-stop")
    page.click("#tab-draws")
    page.fill("#draw-n", "10000")
    page.click("#draw-run")
    assert "at most 256" in page.text_content("#error")
    page.fill("#draw-n", "2")
    page.fill("#draw-max", "3")
    draw(page, 2)
    first = tab.cells("#draw-table tbody tr")[0][1]
    page.fill("#draw-max", "6")  # changed after the draw: "again" still asks what was drawn
    page.click("#draw-table tbody tr:first-child button")
    page.wait_for_function("() => document.querySelector('#draw-table tbody tr .col-alone').textContent !== 'again'")
    assert tab.cells("#draw-table tbody tr")[0][3] == "same", first
    tab.close()


def test_a_blank_prompt_a_bad_budget_and_a_rerun_say_so_as_the_cli_would(browser, server):
    """Was: with the chat template on, Draw and Generate drew from a blank prompt (the CLI and the other views
    refuse it); Generate's max tokens 0, -3 or 2.5 became 64 without a word; an error read "top_p: top_p must
    ..."; and a walk started while one ran was labelled "stopped" by the old one."""
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt("   ")
    page.click("#tab-draws")
    page.fill("#draw-n", "2")
    page.click("#draw-run")
    assert page.text_content("#error") == "prompt is empty; give the text to read"
    page.click("#tab-generate")
    page.click("#gen-run")
    assert page.text_content("#error") == "prompt is empty; give the text to read"
    tab.type_prompt(HERB)
    for bad in ("0", "-3", "2.5"):
        page.fill("#gen-max", bad)
        page.click("#gen-run")
        assert "max tokens must be a whole number >= 1" in page.text_content("#error")
    assert tab.posts("/v1/chat/completions") == 0
    page.fill("#top-p", "0")  # the server's refusal, its field named once
    page.fill("#gen-max", "2")
    page.click("#gen-run")
    page.wait_for_function("() => document.querySelector('#error').textContent !== ''", timeout=60_000)
    message = page.text_content("#error")
    assert message.count("top_p") == 1, message
    page.fill("#top-p", "1")
    page.fill("#top-k", "2.7")  # was: silently 2, and --top-k 2 in the copied command
    page.click("#gen-run")
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('top_k')", timeout=60_000)
    page.fill("#top-k", "0")
    page.click("#tab-answers")
    page.fill("#ans-temps", "0x10")  # was: read as 16
    page.click("#ans-run")
    assert "temperatures must be numbers" in page.text_content("#error")
    page.fill("#ans-temps", "1")
    page.fill("#ans-max", "5")
    page.fill("#ans-nodes", "3000")
    page.click("#ans-run")
    page.wait_for_timeout(300)
    page.press("#prompt", "Control+Enter")  # a new walk while the first runs: the first's end must not label it
    page.wait_for_timeout(300)
    assert page.text_content("#status") == "walking the answers…" and page.is_disabled("#ans-run")
    page.click("#ans-stop")
    page.wait_for_function("() => document.querySelector('#status').textContent === 'stopped'", timeout=60_000)
    tab.close()


def test_a_result_is_marked_stale_once_its_inputs_change_and_enter_runs_a_field(browser, server, shots):
    """Was: a table stayed as if current under a command line that the changed inputs had rewritten (draws of the
    fruit prompt under `--prompt 'Name one herb…' --temp 0`), a blank T went out as null (the server's default),
    Enter in a field did nothing and eight clicks on Run sent eight requests. A result whose inputs changed is
    dimmed under a note (not for the draws' grouping, a re-tally on the page); a blank T is refused on the page
    and gets no command line; Enter in a field runs."""
    tab = Tab(browser, server)
    page = tab.page
    stale = "(id) => document.getElementById(id).classList.contains('stale')"
    tab.type_prompt(FRUIT)
    page.evaluate("() => { for (let i = 0; i < 8; i++) document.getElementById('run').click(); }")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('scored')")
    assert tab.posts("/mlxinfer/next-token") == 1 and not page.evaluate(stale, "view-next")
    page.fill("#temp", "0.3")  # the table re-draws itself from its scores: still current
    assert not page.evaluate(stale, "view-next")
    tab.type_prompt(HERB)
    assert page.evaluate(stale, "view-next") and page.is_visible("#view-next .stale-note")
    page.press("#rows", "Enter")  # a field's Enter runs its view
    page.wait_for_function(f"() => document.querySelector('#next-prompt').textContent === {json.dumps(repr(HERB))}")
    assert tab.posts("/mlxinfer/next-token") == 2 and not page.evaluate(stale, "view-next")
    page.fill("#temp", "")
    assert "got nothing" in page.text_content("#next-cut") and "error" in page.get_attribute("#next-cut", "class")
    page.click("#tab-draws")
    page.fill("#draw-n", "2")
    page.click("#draw-run")
    assert "temperature must be" in page.text_content("#error") and tab.posts("/v1/chat/completions") == 0
    page.fill("#temp", "1")
    page.fill("#draw-max", "3")
    page.press("#draw-max", "Enter")
    ended = "() => [...document.querySelectorAll('#draw-table .col-end')].filter(c => c.textContent).length === 2"
    page.wait_for_function(ended, timeout=120_000)
    assert not page.evaluate(stale, "view-draws")
    page.select_option("#draw-group", "text")  # the same draws, tallied another way on the page: still current
    assert not page.evaluate(stale, "view-draws")
    page.fill("#temp", "")  # a setting the CLI would refuse: no command line for it (was: --temp NaN)
    assert page.text_content("#draw-cli") == ""
    page.fill("#temp", "0")  # the command line now says --temp 0; the draws were at T = 1
    assert "--temp 0" in page.text_content("#draw-cli") and page.evaluate(stale, "view-draws")
    page.fill("#temp", "1")  # back to what they were drawn with
    assert not page.evaluate(stale, "view-draws")
    page.fill("#draw-n", "10000")
    page.click("#draw-run")  # refused: what is shown is the last run's, not this one's
    assert "at most 256" in page.text_content("#error") and page.evaluate(stale, "view-draws")
    tab.shoot(shots, "stale-draws")
    tab.close()


def test_the_page_refuses_what_the_cli_refuses_and_offers_the_next_tokens_command(browser, server):
    """Was: T = T2 failed to score ("temperatures lists 0.5 more than once"); T = 3 went out to /v1 and every
    draw "failed" in the server's words; a prompt a chat template rendered was refused by two views and drawn by
    the other two (whose copied command lines the CLI refuses); the Next token view had no command line;
    T = 1e-06 was headed "T=0.000001"; Ctrl+Enter during a click's run scored twice."""
    tab = Tab(browser, server)
    page = tab.page
    tab.type_prompt(FRUIT)
    page.fill("#temp", "0.5")
    page.fill("#temp2", "0.5")
    page.click("#next-run")
    page.press("#prompt", "Control+Enter")  # while the click's run is in flight: no second request
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('scored')", timeout=120_000)
    assert tab.posts("/mlxinfer/next-token") == 1
    rows = tab.cells("#next-table tbody tr")
    assert all(r[4] == r[5] for r in rows)
    command = page.text_content("#next-cli")
    assert "--temps 0.5 " in command and "--explain" in command
    copied = run_copied(command)
    assert [int(r[2]) for r in rows] == [r["id"] for r in copied["rows"]]
    assert [r[4] for r in rows] == [f"{r['probs'][0]:.3f}" for r in copied["rows"]]
    assert [r[7] for r in rows] == [f"{r['final_prob']:.3f}" for r in copied["explanation"]["rows"]]
    page.fill("#temp", "0.000001")
    assert page.text_content("#next-th-p1") == "p @ T=1e-06"  # the header as Python's :g writes it
    assert "--temps 0.000001,0.5" in page.text_content("#next-cli")  # the command line as typed

    page.fill("#temp", "3")  # the CLI's sample takes it; /v1 keeps OpenAI's 0 to 2: said on the page
    for view, button in (("draws", "#draw-run"), ("generate", "#gen-run")):
        page.click(f"#tab-{view}")
        page.click(button)
        assert "temperature must be at most 2 in this view, got 3" in page.text_content("#error")
    page.fill("#temp", "1")
    tab.type_prompt("<|im_start|>user\nName a fruit.<|im_end|>")
    refusal = "opens with <|im_start|>, a control token's name: it looks rendered by a chat template already"
    for view, button in (("draws", "#draw-run"), ("generate", "#gen-run"), ("next", "#next-run")):
        page.click(f"#tab-{view}")
        page.click(button)
        assert refusal in page.text_content("#error"), view
    assert tab.posts("/v1/chat/completions") == 0 and tab.posts("/mlxinfer/next-token") == 1
    cli = invoke_cli("sample", "--prompt", "<|im_start|>user\nName a fruit.<|im_end|>", "--seeds", "1")
    assert cli.returncode == 2 and refusal in cli.stderr  # the CLI's refusal, in the same words
    tab.close()
