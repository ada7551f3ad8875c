"""BFCL's stateful backends as an Environment: instances from ``initial_config``, calls run as
the official executor runs them, with the same results and errors, but model output never
reaches ``eval()``.

The official executor builds a call string per call (``name(k=repr(v),...)``), prefixes every
``identifier(`` that names a public backend method with the method's instance (even inside a
string literal), refuses a few names, and ``eval``s the text in its module's namespace. Here
the same text is rewritten the same way, parsed by Python's own parser (so identifiers are
NFKC-normalised as ``eval`` sees them, and syntax errors read the same), and the expression
is interpreted: calls of backend methods, literals, containers, unary operators, ``and``/``or``.
So ``ｌｓ`` is ``ls``, which the official namespace does not hold (NameError), ``Class.method``
fails on the class's name, and ``cd(folder='x')`` used as a name runs ``cd`` and then calls
its result. Python beyond that subset (operators, builtins, modules of the evaluator's
namespace) gets an error result saying so: the official evaluator would run it as Python.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import copy
import importlib
import inspect
import io
import json
import operator
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from astra_agent.environment import Environment, ToolResult, ToolSpec
from astra_agent.episode import CallPolicy
from astra_agent.pysource import parse
from eval.bfcl.official import Entry, class_tools

STEP_LIMIT = 20  # the official MAXIMUM_STEP_LIMIT (model steps a turn)
# The official harness's call semantics in the loop: every call goes to the backends unchecked,
# a step whose calls do not decode ends the turn with none of them run.
OFFICIAL_CALLS = CallPolicy(check_names=False, check_arguments=False, end_on_undecodable=True)
# What the official executor refuses by name (its wording is kept).
BLOCKED = {"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"}
# An identifier followed by "(": where the official executor inserts an instance name.
CALLED_NAME = re.compile(r"\b([a-zA-Z_]\w*)\s*(?=\()")
ERROR = "Error during execution: "
IDLE_S = 2.0  # idle this long, an entry's worker gives its thread back and a pool thread ends
# Builtins without side effects, run for real on plain values (print's output is dropped).
_PURE_FUNCTIONS: tuple[Callable[..., Any], ...] = (abs, bool, dict, float, int, len, list)
_PURE_FUNCTIONS += (max, min, print, repr, round, set, sorted, str, sum, tuple)
_PURE = {f.__name__: f for f in _PURE_FUNCTIONS}
_DICT_READS = {"get", "keys", "values", "items"}
_PLAIN = (type(None), bool, int, float, complex, str, list, tuple, dict, set, frozenset)
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
    ast.Invert: operator.invert,
}


def new_instances(entry: Entry) -> dict[str, Any]:
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    out = {}
    for name in entry.involved_classes:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(name, {}))
            instance._load_scenario(config, long_context=entry.long_context)
        out[name] = instance
    return out


def method_table(instances: dict[str, Any]) -> dict[str, Any]:
    """Public method name → bound method (a later class wins a shared name, as there)."""
    table = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = method
    return table


@cache
def _official_globals() -> frozenset[str]:
    """Names the official ``eval`` resolves besides instances: builtins, its module's names."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    own = {k for k in vars(multi_turn_utils) if not k.endswith("_instance")}
    return frozenset(dir(builtins)) | own


class Unsupported(Exception):
    """Python that the official evaluator would ``eval`` but this executor does not run."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is not supported by this harness (the official evaluator evaluates it "
            "as Python)"
        )


@dataclass(frozen=True)
class Namespace:
    """What the official ``eval`` sees of one side's instances: each under an instance name
    (``{tag}_{class}_instance``), each public method mapped to its instance's name."""

    instances: dict[str, Any]  # instance name → instance
    methods: dict[str, str]  # public method name → instance name

    @classmethod
    def of(cls, instances: dict[str, Any], tag: str) -> Namespace:
        named, methods = {}, {}
        for cls_name, instance in instances.items():
            key = re.sub(r"[-./:]", "_", f"{tag}_{cls_name}_instance")
            named[key] = instance
            for method in method_table({cls_name: instance}):
                methods[method] = key
        return cls(named, methods)

    def rewrite(self, call: str) -> str:
        """Each ``method(`` as ``instance.method(``, anywhere in the text, as there."""

        def prefix(m: re.Match[str]) -> str:
            name = m[1]
            return f"{self.methods[name]}.{name}" if name in self.methods else name

        return CALLED_NAME.sub(prefix, call)

    def execute(self, call: str) -> str:
        """One call string's result text, exactly as the official executor's."""
        try:
            text = self.rewrite(call)
            head = text.split("(")[0]
            if "." in head:
                head = head.split(".")[1]
            if head in BLOCKED:
                raise Exception(f"Function call {head} is not allowed.")
            source = text.lstrip(" \t")  # as eval() does with a string
            tree = parse(source, "<string>", "eval")
            compile(tree, "<string>", "eval")  # the compiler's own syntax errors, as eval's
            return format_result(self._eval(tree.body))
        except Exception as exc:  # the official wording for any failure
            return f"{ERROR}{exc}"

    def _owned(self, value: Any) -> bool:
        return any(value is i for i in self.instances.values())

    def _eval(self, node: ast.expr) -> Any:
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name(id=name):
                if name in self.instances:
                    return self.instances[name]
                if name in _PURE:
                    return _PURE[name]
                if name in _official_globals():
                    raise Unsupported(f"the name {name!r}")
                raise NameError(f"name '{name}' is not defined")
            case ast.Attribute(value=value, attr=attr):
                obj = self._eval(value)
                if attr.startswith("__") or not (self._owned(obj) or _plain(obj)):
                    raise Unsupported(f"the attribute {attr!r} of a {type(obj).__name__}")
                return getattr(obj, attr)
            case ast.Call():
                return self._call(node)
            case ast.List(elts=elts) | ast.Tuple(elts=elts) | ast.Set(elts=elts):
                items = [self._eval(e) for e in self._plain(elts)]
                kind = {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)]
                return kind(items)
            case ast.Dict(keys=keys, values=values):
                if any(k is None for k in keys):
                    raise Unsupported("'**' in a dict")
                pairs = [(self._eval(k), self._eval(v)) for k, v in zip(keys, values, strict=True)]  # type: ignore[arg-type]
                return dict(pairs)
            case ast.UnaryOp(op=op, operand=operand):
                return _UNARY[type(op)](self._eval(operand))
            case ast.BoolOp(op=op, values=values):
                result = None
                for value in values:
                    result = self._eval(value)
                    if bool(result) == isinstance(op, ast.Or):
                        break
                return result
        raise Unsupported(f"a {type(node).__name__} expression")

    @staticmethod
    def _plain(elts: list[ast.expr]) -> list[ast.expr]:
        if any(isinstance(e, ast.Starred) for e in elts):
            raise Unsupported("'*' unpacking")
        return elts

    def _call(self, node: ast.Call) -> Any:
        fn = self._eval(node.func)
        args = [self._eval(a) for a in self._plain(node.args)]
        if any(k.arg is None for k in node.keywords):
            raise Unsupported("'**' unpacking")
        kwargs = {k.arg: self._eval(k.value) for k in node.keywords if k.arg is not None}
        if not callable(fn):
            raise TypeError(f"'{type(fn).__name__}' object is not callable")
        if inspect.ismethod(fn) and self._owned(fn.__self__):
            return fn(*args, **kwargs)
        plain_args = all(map(_plain, [*args, *kwargs.values()]))
        if type(getattr(fn, "__self__", None)) is dict and fn.__name__ in _DICT_READS:
            return fn(*args, **kwargs) if plain_args else _unsupported(fn)
        if any(fn is f for f in _PURE.values()) and plain_args:
            if fn is print:
                kwargs = {**kwargs, "file": io.StringIO()} if "file" not in kwargs else kwargs
                if not isinstance(kwargs["file"], io.StringIO):
                    raise Unsupported("print to a file")
            return fn(*args, **kwargs)
        return _unsupported(fn)


def _unsupported(fn: Any) -> Any:
    raise Unsupported(f"calling {getattr(fn, '__qualname__', type(fn).__name__)}")


def _plain(value: Any) -> bool:
    """Data only (no objects with behaviour of their own), to any depth."""
    if type(value) in (list, tuple, set, frozenset):
        return all(map(_plain, value))
    if type(value) is dict:
        return all(map(_plain, value)) and all(map(_plain, value.values()))
    return type(value) in _PLAIN


def format_result(value: Any) -> str:
    """The official executor's text for a return value."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``"f(1, b='x')"`` → ("f", [1], {"b": "x"}) with literals only (ast, never eval): for
    reading ground-truth calls."""
    node = parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name | ast.Attribute):
        raise ValueError(f"not a function call: {text!r}")
    name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return name, args, kwargs


def execute_calls(ns: Namespace, calls: list[str]) -> list[str]:
    """Execute call strings (ground truth or decoded model calls) in order."""
    return [ns.execute(call) for call in calls]


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """The official decoded form of a function-calling model's call: ``f(a=1,b='x')``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _decode_call(call: Any) -> list[str]:
    if not isinstance(call, dict):
        raise TypeError("a call is not an object")
    out = []
    for name, value in call.items():
        if type(value) is str:
            value = json.loads(value)  # any failure: the step does not decode
        if not isinstance(value, dict):
            raise TypeError("arguments are not an object")
        out.append(call_string(name, value))
    return out


def decode_step(responses: Any) -> list[str] | None:
    """One model step as the official function-calling decoder decodes it: the step's calls
    ``[{name: json_arguments}, ...]`` (or one such object) become ``["name(a=1)", ...]``.
    None when the step does not decode — text, arguments that are not valid JSON (including
    JSON that ``json`` gives up on: integers over 4,300 digits, deep nesting) or not an
    object — and the official harness then drops the whole step, even calls that decode."""
    if isinstance(responses, dict):
        responses = [responses]
    if not isinstance(responses, list):
        return None
    try:
        return [text for call in responses for text in _decode_call(call)]
    except (TypeError, ValueError, RecursionError):
        return None


class _Tool(ToolSpec):
    """A backend function as a tool whose OpenAI schema is built once: every request of
    every entry that offers it sends the same object (never changed in place), which the
    model client encodes once (:class:`astra_agent.http_client.BodyEncoder`)."""

    def to_openai(self) -> dict[str, Any]:
        schema = self.__dict__.get("_openai")
        if schema is None:
            schema = super().to_openai()
            object.__setattr__(self, "_openai", schema)
        return schema


@cache
def _class_tools(cls: str) -> tuple[ToolSpec, ...]:
    return tuple(_Tool.from_openai(t) for t in class_tools([cls]))


def _tool_specs(entry: Entry, turn: int | None = None) -> list[ToolSpec]:
    """The tools an entry starts with (held-out functions left out), or those held out until
    ``turn``; as the official harness builds them, each built once a run."""
    held = entry.missed_function
    if turn is None:
        names = {f for fs in held.values() for f in fs}
        return [t for c in entry.involved_classes for t in _class_tools(c) if t.name not in names]
    names = set(held.get(str(turn), []))
    return [t for c in entry.involved_classes for t in _class_tools(c) if t.name in names]


class _Threads:
    """Daemon threads for the entries' workers: a task goes to an idle thread, or to a new
    one when none is idle; a thread idle for ``IDLE_S`` ends. Entries come and go by the
    hundred: starting a thread for each cost the event loop a thread start (and its wait for
    the thread to run) every time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tasks: deque[Callable[[], None]] = deque()
        self._idle = 0

    def run(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._tasks.append(task)
            if self._idle >= len(self._tasks):  # an idle thread for every waiting task
                self._cond.notify()
                return
        threading.Thread(target=self._serve, name="bfcl-backend", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                if not self._tasks:
                    self._idle += 1
                    self._cond.wait(IDLE_S)
                    self._idle -= 1
                    if not self._tasks:
                        return
                task = self._tasks.popleft()
            task()
            del task  # an idle thread holds nothing of the task


_THREADS = _Threads()


class _Worker:
    """Runs an entry's backend calls one at a time, in the order they were given, on one
    daemon thread (of :class:`_Threads`): taken by a call when none is running, it is given
    back once it has waited ``IDLE_S`` for the next call, or at ``close``. A hung call keeps
    its thread, and the entry's later calls wait behind it (their timeouts fire)."""

    def __init__(self) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._running = False
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            if self._running:
                self._cond.notify()
                return
            self._running = True
        _THREADS.run(self._drain)

    def close(self) -> None:
        """Give the thread back once the calls given so far have run."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._closed:
                    self._cond.wait(IDLE_S)
                if not self._jobs:
                    self._running = False
                    return
                job = self._jobs.popleft()
            job()
            del job  # an idle worker holds no call (nor the environment through it)


class BFCLEnvironment(Environment):
    """One entry's backend instances, alive for the whole entry (all its turns); ``reset()``
    gives new ones from the entry's initial configuration, and the initial tools.

    Each call runs on the entry's worker thread, so the loop's tool timeout applies and a slow
    backend does not stall other entries; one entry's calls still run one at a time, in call
    order (a call waits for the previous one), as the official executor runs them."""

    def __init__(self, entry: Entry, tag: str = "astra") -> None:
        self.entry = entry
        self._tag = f"{tag}_{entry.id}"
        self._fresh()

    def _fresh(self) -> None:
        self.instances = new_instances(self.entry)
        self.namespace = Namespace.of(self.instances, self._tag)
        self._tools = _tool_specs(self.entry)
        self._worker = _Worker()
        self.executed: list[str] = []  # every result, in order (the response check uses them)

    async def reset(self) -> None:
        """New instances (a call still running finishes on the old ones, unseen)."""
        self._worker.close()
        self._fresh()

    def add_tools(self, schemas: list[dict[str, Any]]) -> None:
        """A held-out function arrives (miss_func)."""
        self._tools += [ToolSpec.from_openai(t) for t in schemas]

    def add_held_out(self, turn: int) -> None:
        """The functions held out until ``turn`` arrive (miss_func): the tools
        :func:`eval.bfcl.official.held_out_tools` gives, each built once a run."""
        self._tools += _tool_specs(self.entry, turn)

    async def list_tools(self) -> list[ToolSpec]:
        return list(self._tools)

    def _in_thread(self, call: str) -> asyncio.Future[str]:
        """Run the call on the entry's worker thread after its previous calls: a hung backend
        blocks only its own entry, and never the interpreter's exit."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        namespace, executed = self.namespace, self.executed  # a reset's new ones: unseen

        def settle(text: str | None, error: Exception | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(text)  # type: ignore[arg-type]

        def job() -> None:
            text, error = None, None
            try:
                text = namespace.execute(call)
                executed.append(text)
            except Exception as exc:  # execute reports failures as text: this is a bug
                error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
                loop.call_soon_threadsafe(settle, text, error)

        self._worker.submit(job)
        return future

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        text = await self._in_thread(call_string(name, arguments))
        return ToolResult(text, is_error=text.startswith(ERROR))

    async def close(self) -> None:
        self._worker.close()
