"""Chat templates: compiled and rendered in Jinja's immutable sandbox, as transformers sets one up,
with a bound on what a render may build.

A chat template is code from a model's files. The sandbox keeps it from Python's internals, and the
caller's CPU deadline (tokenizer._deadline) stops one that loops; neither stops one line from asking
for gigabytes: `{{ 'x' * 10**10 }}`, `center(10**10)`, `'%999999999s' % ''`, a join or replace that
multiplies. Those operations are checked against the render's budget before they run (four times
the messages' own text, and 1 MiB), and the rendered text is counted as it is joined. Past the
budget, the render stops with TemplateTooLarge. GGUF tokenizers render here; transformers is routed
here too (route_transformers), so every template a model brings runs in this one sandbox.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import re
from datetime import datetime

from .errors import is_whole

BUDGET_FLOOR = 1 << 20  # characters a render may build beyond four times the messages' own text
_budget: contextvars.ContextVar[int | None] = contextvars.ContextVar("template_budget", default=None)
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\d*|\*)(?:\.(\d*|\*))?")  # %-format: width, precision
_BRACES = re.compile(r"\{[^{}]*?:(?:.?[<>=^])?[-+ ]?#?0?(\d*)[,_]?(?:\.(\d*))?")  # str.format: width, precision
_GROWTH = 512 << 20  # bytes a render may add to the process's memory, whatever built them


class TemplateTooLarge(BaseException):
    """A chat template asked to build more text than its render's budget. A BaseException, so that Jinja's
    own `except Exception` (its compile-time constant folding tries filters and gives up quietly) cannot
    swallow it."""


def _check(size: int) -> None:
    most = _budget.get()
    if most is None:
        most = BUDGET_FLOOR  # compile_chat_template's template rendered outside budget(): the floor alone
    if size > most:
        raise TemplateTooLarge(f"{size:,} characters, over the {most:,} this render allows")


def _widths(fmt, args=(), pattern=_PERCENT) -> None:
    """What a format string may build: the widths and precisions it asks for (a 1-character spec can ask
    for 1 GB), and each placeholder filled with the largest argument; a width given as an argument ('*',
    '{:{1}}') is an argument, so every whole-number argument is a width too."""
    if not isinstance(fmt, str):
        return
    for numbers in pattern.findall(fmt):
        for n in numbers:
            if len(n) >= 20:
                raise TemplateTooLarge("a format width of 20 digits or more")
            _check(int(n) if n.isdigit() else 0)
    values = (
        list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (list, tuple)) else [args]
    )
    _check(max((v for v in values if is_whole(v)), default=0))
    _check(len(fmt) + (fmt.count("%") + fmt.count("{")) * max((_size(v) for v in values), default=0))


def _size(value) -> int:
    """Characters a value stands for: a string's length, a list's items' (strings by length, others as one)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(len(v) if isinstance(v, str) else 1 for v in value)
    return 0


def _resident() -> int | None:
    try:
        with open("/proc/self/statm") as f:  # Linux; elsewhere the checks above and the deadline alone
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_start: contextvars.ContextVar[int | None] = contextvars.ContextVar("template_start", default=None)


def check_growth() -> None:
    """Called from the render's trace (tokenizer._deadline) every so many lines: the memory a render has added,
    however it built it (a `~` in a loop, a namespace that grows), against _GROWTH."""
    start = _start.get()
    now = _resident() if start is not None else None
    if now is not None and now - start > _GROWTH:
        raise TemplateTooLarge(f"{(now - start) >> 20:,} MB of memory while rendering, more than {_GROWTH >> 20:,}")


def _before_call(obj, args: tuple, kwargs: dict) -> tuple:
    """The size a str method or a filter is about to build, from its arguments, checked first; the arguments
    to call it with (a generator given to join is read here, to be sized)."""
    name = getattr(obj, "__name__", "")
    owner = getattr(obj, "__self__", None)
    if owner is None:  # the sandbox hands str.format out wrapped (jinja2.sandbox.wrap_str_format)
        owner = getattr(getattr(obj, "__wrapped__", None), "__self__", None)
    numbers = [a for a in (*args, *kwargs.values()) if is_whole(a)]
    if name in ("center", "ljust", "rjust", "zfill", "do_center") and numbers:
        _check(max(numbers))
    elif name == "do_indent" and args and isinstance(args[0], str) and numbers:
        _check(len(args[0]) + max(numbers) * (1 + args[0].count("\n")))
    elif name == "expandtabs" and isinstance(owner, str):
        _check(len(owner) + owner.count("\t") * (numbers[0] if numbers else 8))
    elif name == "replace" and isinstance(owner, str) and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        old, new = args[:2]
        _check(len(owner) + owner.count(old) * max(0, len(new) - len(old)) if old else len(owner) * (1 + len(new)))
    elif name == "do_replace" and len(args) >= 3 and all(isinstance(a, str) for a in args[:3]):
        text, old, new = args[:3]
        _check(len(text) + text.count(old) * max(0, len(new) - len(old)) if old else len(text) * (1 + len(new)))
    elif name in ("join", "do_join"):
        items = args[0] if args else ()
        sep = owner if isinstance(owner, str) else args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        if isinstance(items, (list, tuple)):
            _check(sum(len(str(i)) for i in items) + len(sep) * len(items))
        elif not isinstance(items, (str, dict)):  # a generator (map, select): sized once it is read
            items = list(items)
            _check(sum(len(str(i)) for i in items) + len(sep) * len(items))
            args = (items, *args[1:])
    elif name in ("format", "format_map") and isinstance(owner, str):
        _widths(owner, [*args, *kwargs.values()] if name == "format" else (args[0] if args else {}), _BRACES)
    elif name == "do_format" and args:
        _widths(args[0], [*args[1:], *kwargs.values()])
    elif name == "do_wordwrap" and args and isinstance(args[0], str):
        wrap = kwargs.get("wrapstring", args[3] if len(args) > 3 else None) or "\n"
        _check(len(args[0]) * (1 + (len(wrap) if isinstance(wrap, str) else 1)))
    elif name == "do_sum" and kwargs.get("start", args[2] if len(args) > 2 else 0) not in (0, 0.0):
        raise TemplateTooLarge("a sum of anything but numbers")  # lists summed in C: no deadline reaches it
    return args


@functools.lru_cache(maxsize=16)
def compile_chat_template(template: str):
    """The template compiled as transformers compiles one (trim_blocks, lstrip_blocks, loop controls,
    the {% generation %} tag, tojson without HTML escaping, raise_exception, strftime_now, and
    dict/namespace that refuse dunders), in an immutable sandbox that checks sizes (see the module)."""
    import jinja2
    import jinja2.ext
    import jinja2.filters
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if tuple(int(p) if p.isdigit() else 0 for p in jinja2.__version__.split(".")[:3]) < (3, 1, 6):
        raise ImportError(  # older versions have known sandbox escapes; templates are untrusted code
            f"apply_chat_template requires jinja2>=3.1.6 to be installed. Your version is {jinja2.__version__}."
        )

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "%", "**"})
        concat = staticmethod(_concat)

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                n = right if isinstance(right, int) else left if isinstance(left, int) else 0
                _check(max(_size(left), _size(right)) * n)
            elif operator == "+":
                _check(_size(left) + _size(right))
            elif operator == "%":
                _widths(left, right)
            elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, int):
                if right > 64 and abs(left) > 1:
                    raise TemplateTooLarge(f"a power of {right:,}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
            args = _before_call(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: transformers marks the assistant's tokens; the text is as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if isinstance(indent, int):
            _check(indent * 1000)  # an indent is repeated on every line
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        _widths(format)
        _check(len(format) * 8 if isinstance(format, str) else 0)  # %c and the like write ~24 characters for 2
        return datetime.now().strftime(format)

    def checked(filter_):
        @functools.wraps(filter_)
        def run(*args, **kwargs):
            lead = args[:1] if args and isinstance(args[0], (jinja2.nodes.EvalContext, jinja2.Environment)) else ()
            return filter_(*lead, *_before_call(filter_, args[len(lead) :], kwargs), **kwargs)

        return run

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute."
                )

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    for name in ("center", "indent", "join", "format", "replace", "wordwrap", "sum"):
        env.filters[name] = checked(env.filters[name])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


@contextlib.contextmanager
def budget(messages: list[dict]):
    """Renders in this block may build four times the messages' text and BUDGET_FLOOR characters."""
    own = sum(len(v) for m in messages if isinstance(m, dict) for v in m.values() if isinstance(v, str))
    token, started = _budget.set(4 * own + BUDGET_FLOOR), _start.set(_resident())
    try:
        yield
    finally:
        _budget.reset(token)
        _start.reset(started)


def render(template: str, messages: list[dict], **variables) -> str:
    """The template rendered for `messages` and the other template variables, within budget(messages)."""
    with budget(messages):
        return compile_chat_template(template).render(messages=messages, **variables)


def _concat(pieces) -> str:
    """What Template.render joins its output with: counted as it comes (a loop of pieces within the
    budget each would otherwise build any size before the join)."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        _check(size)
        out.append(piece)
    return "".join(out)


def route_transformers() -> None:
    """Have transformers compile chat templates here while a render of ours is under way (inside budget()),
    so that an HF tokenizer's template renders in the same bounded sandbox: its render_jinja_template looks
    _compile_jinja_template up at each call, and everything else it does (kwargs, reasoning fields, named
    templates) stays its own. Any other render in the process (a caller's own apply_chat_template, an
    assistant-token mask) gets transformers' own environment, as if this module were not there."""
    from transformers.utils import chat_template_utils

    own = getattr(chat_template_utils, "_compile_jinja_template", None)
    if own is None or getattr(own, "_mlxinfer", False):
        return

    def compile_here_when_ours(template):
        return compile_chat_template(template) if _budget.get() is not None else own(template)

    compile_here_when_ours._mlxinfer = True
    chat_template_utils._compile_jinja_template = compile_here_when_ours
