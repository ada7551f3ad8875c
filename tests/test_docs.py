"""The README and the pages in ``docs/`` stay true to the repository.

Per page: every relative link resolves (a file, and a ``#heading`` of it if one is named);
every repository path written as code (`` `training/sft/trl.py` ``) exists; and every command
in a shell block, or written as code in the text, that can be checked without running it is
checked against the code:

- ``astra-agent|astra-serve|astra-eval|astra-train …``: the subcommands exist and every option
  is one that subcommand's ``--help`` lists (the installed entry points, run with this
  checkout first on ``PYTHONPATH``);
- ``python -m MODULE …`` for a module of our packages: the same, against its ``--help``;
- ``make TARGET``: the Makefile has the target.

Anything else (``huggingface-cli``, ``bash``, a benchmark script) is skipped by that rule. Each
``--help`` runs once, all of them side by side.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent
CLIS = ("astra-agent", "astra-serve", "astra-eval", "astra-train")
PACKAGES = ("astra_agent", "serving", "eval", "training")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# A repository path written as code: under one of these folders, no placeholder characters.
REPO_PATH = re.compile(
    r"(?:\./)?(?:astra_agent|serving|eval|training|tests|bench|examples|scripts|docs)/[\w./-]*"
)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# Link targets: inline (`[text](target "title")`, images too), reference definitions
# (`[ref]: target`) and HTML attributes (`<img src="target">`).
LINK = re.compile(
    r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)"
    r"|^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)"
    r"|\b(?:src|href)=\"([^\"]+)\""
)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# Rows of a help text that name options: rich's panels (`│ --out -o <path>`; `│ *  --config`
# and `│    --out` in a panel with a required option) and argparse's (`  -h, --help`); a
# description's wrapped line is indented further.
OPTION_ROW = re.compile(r"^(?:│ {1,4}| {2})(?:\* +)?(-.*)$")
OPTION = re.compile(r"-{1,2}[A-Za-z0-9][\w-]*")
COMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*")


# ---------------------------------------------------------------------------------- markdown


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str


@dataclass
class Page:
    path: Path
    prose: list[tuple[int, str]]  # (1-based line, text) outside fenced blocks
    blocks: list[Block]


def parse_page(path: Path, text: str | None = None) -> Page:
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    fence: tuple[str, str, int] | None = None  # (marker, lang, line)
    body: list[str] = []
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, body = (m.group(2), m.group(3).lower(), i), []
            else:
                prose.append((i, line))
        elif m and m.group(2).startswith(fence[0]) and not m.group(3):
            blocks.append(Block(fence[1], fence[2], "\n".join(body)))
            fence = None
        else:
            body.append(line)
    assert fence is None, f"{path.name}:{fence[2]}: a fenced block is never closed"
    return Page(path, prose, blocks)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces → hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in page.prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(page: Page) -> Iterator[str]:
    for lineno, line in page.prose:
        for groups in LINK.findall(CODE_SPAN.sub("", line)):
            target = next(g for g in groups if g)
            if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:, …
                continue
            where = f"{page.path.name}:{lineno}: link {target}"
            file_part, _, anchor = target.partition("#")
            dest = (page.path.parent / file_part).resolve() if file_part else page.path
            if not dest.exists():
                yield f"{where}: {file_part} does not exist"
            elif anchor and dest.suffix == ".md" and anchor not in anchors(parse_page(dest)):
                yield f"{where}: {dest.name} has no heading #{anchor}"


def path_problems(page: Page, commands: Iterable[list[str]]) -> Iterator[str]:
    spans = [(n, s) for n, line in page.prose for _, s in CODE_SPAN.findall(line)]
    words = [(n, w) for n, span in spans for w in span.split()]
    words += [(0, w) for tokens in commands for w in tokens]
    for lineno, word in words:
        if REPO_PATH.fullmatch(word) and not (REPO / word).exists():
            where = f"{page.path.name}:{lineno}" if lineno else f"{page.path.name} (shell block)"
            yield f"{where}: {word} does not exist in the repository"


# ------------------------------------------------------------------------------ shell blocks


def shell_commands(page: Page) -> Iterator[tuple[int, list[str]]]:
    """Each simple command of the page's shell blocks as words: continuations joined,
    comments dropped, split at ``&&``, ``||``, ``|``, ``;`` and ``&``; brackets that mark an
    optional part (``[--resume]``) are separate words."""
    for block in page.blocks:
        if block.lang not in SHELL_LANGS:
            continue
        for offset, line in enumerate(block.text.replace("\\\n", " ").splitlines(), 1):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True  # words whole; only ;&|()<> split them
            try:
                tokens = list(lexer)
            except ValueError:  # an unbalanced quote: still check what the words say
                tokens = line.split("#")[0].split()
            words: list[str] = []
            for token in tokens:
                if token and set(token) <= set("&|;()<>"):
                    if words:
                        yield block.line + offset, words
                    words = []
                else:
                    words.append(token)
            if words:
                yield block.line + offset, words


def inline_commands(page: Page) -> Iterator[tuple[int, list[str]]]:
    """Code spans in the text that are a command of ours (`` `astra-serve tiny OUT [--seed N]` ``,
    `` `astra-agent run --save` ``), as words."""
    for lineno, line in page.prose:
        for _, span in CODE_SPAN.findall(line):
            try:
                words = shlex.split(span)
            except ValueError:
                words = span.split()
            if words and program(words) is not None:
                yield lineno, words


def commands(page: Page) -> Iterator[tuple[int, list[str]]]:
    yield from shell_commands(page)
    yield from inline_commands(page)


@dataclass
class Help:
    ok: bool
    text: str

    def commands(self) -> set[str]:
        out, panel = set(), ""
        for line in self.text.splitlines():
            if line.startswith("╭"):
                panel = line
            elif (m := re.match(r"│ ([a-z][\w-]*) ", line)) and "Argument" not in panel:
                out.add(m.group(1))
        return out

    def options(self) -> set[str]:
        out = {"--help"}
        for line in self.text.splitlines():
            if m := OPTION_ROW.match(line):
                for word in re.split(r"[\s,]+", m.group(1)):
                    if not OPTION.fullmatch(word):
                        break
                    out.add(word)
        return out

    def takes_command(self) -> bool:
        return any("COMMAND" in line for line in self.text.splitlines() if "Usage" in line)


# Runs in one process per program: each ``--help`` through the installed entry point script
# (``.venv/bin/astra-serve``) or ``runpy`` for ``python -m``, as a shell would run it, but the
# imports paid once (``astra-serve`` imports torch: ≈3 s a start).
_DRIVER = """
import contextlib, io, json, runpy, sys
target, calls, out = sys.argv[1], json.loads(sys.argv[2]), {}
for words in calls:
    buf, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        sys.argv = [target, *words, "--help"]
        try:
            if target.startswith("-m "):
                runpy.run_module(target[3:], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException as exc:
            code = 1
            print(f"{type(exc).__name__}: {exc}")
    out[json.dumps(words)] = [code, buf.getvalue()]
print(json.dumps(out))
"""


class HelpCache:
    """``--help`` of each command line, run once; the calls of one program in one process,
    the programs side by side."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=3)
        self._runs: dict[tuple[str, ...], Future[dict[str, tuple[int, str]]]] = {}
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "COLUMNS": "300",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }

    @staticmethod
    def _split(argv: tuple[str, ...]) -> tuple[str, list[str]]:
        """(the program's target for the driver, the words after it)."""
        if argv[1:2] == ("-m",):
            return f"-m {argv[2]}", list(argv[3:])
        return argv[0], list(argv[1:])

    def _run(self, target: str, calls: list[list[str]]) -> dict[str, tuple[int, str]]:
        proc = subprocess.run(
            [str(BIN / "python"), "-c", _DRIVER, target, json.dumps(calls)],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{target}: the --help driver failed:\n{proc.stderr[-3000:]}"
        return {k: (code, text) for k, (code, text) in json.loads(proc.stdout).items()}

    def prefetch(self, argvs: Iterable[tuple[str, ...]]) -> None:
        by_target: dict[str, list[tuple[str, ...]]] = {}
        for argv in dict.fromkeys(argvs):
            if argv not in self._runs:
                by_target.setdefault(self._split(argv)[0], []).append(argv)
        for target, group in by_target.items():
            future = self._pool.submit(self._run, target, [self._split(a)[1] for a in group])
            self._runs.update((a, future) for a in group)

    def get(self, argv: tuple[str, ...]) -> Help:
        self.prefetch([argv])
        code, text = self._runs[argv].result()[json.dumps(self._split(argv)[1])]
        return Help(code == 0, text)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def program(words: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    """The argv of the program to ask for ``--help`` and the words after it, or None when the
    command is not one of ours (skipped by rule)."""
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):  # VAR=value cmd …
        words = words[1:]
    if not words:
        return None
    name = Path(words[0]).name
    if name in CLIS:
        return (str(BIN / name),), words[1:]
    python = re.fullmatch(r"python(3(\.\d+)?)?", name) and words[1:2] == ["-m"]
    if python and len(words) > 2 and words[2].split(".")[0] in PACKAGES:
        return (str(BIN / "python"), "-m", words[2]), words[3:]
    return None


def option_words(words: list[str]) -> Iterator[str]:
    for word in words:
        word = word.strip("[]")
        if re.match(r"-{1,2}[A-Za-z]", word):
            yield word.split("=", 1)[0]


def command_problems(page: Page, helps: HelpCache) -> Iterator[str]:
    makefile = (REPO / "Makefile").read_text()
    for lineno, words in commands(page):
        where = f"{page.path.name}:{lineno}: `{' '.join(words)}`"
        if Path(words[0]).name == "make":
            for target in (w for w in words[1:] if not w.startswith("-") and "=" not in w):
                if not re.search(rf"^{re.escape(target)}\s*:", makefile, re.M):
                    yield f"{where}: the Makefile has no target {target!r}"
            continue
        found = program(words)
        if found is None:
            continue
        argv, rest = found
        help_ = helps.get(argv)
        while help_.ok and rest and rest[0] in help_.commands():
            argv, rest = (*argv, rest[0]), rest[1:]
            help_ = helps.get(argv)
        cli = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))
        if not help_.ok:
            yield f"{where}: `{cli} --help` failed:\n{help_.text[-2000:]}"
        elif rest and COMMAND_WORD.fullmatch(rest[0]) and help_.takes_command():
            yield f"{where}: no subcommand {rest[0]!r} (it has {sorted(help_.commands())})"
        else:
            accepted = help_.options()
            for option in option_words(rest):
                if option not in accepted:
                    yield f"{where}: `{cli}` has no option {option}"


def prefetch(pages: Iterable[Page], helps: HelpCache) -> None:
    """Start every ``--help`` a page may need: the program, and each run of command-like words
    after it (a word that is no subcommand costs one wasted call)."""
    wanted = []
    for page in pages:
        for _, words in commands(page):
            found = program(words)
            if found is None:
                continue
            argv, rest = found
            wanted.append(argv)
            for word in rest[:3]:
                if not COMMAND_WORD.fullmatch(word):
                    break
                argv = (*argv, word)
                wanted.append(argv)
    helps.prefetch(wanted)


# ---------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def helps() -> Iterator[HelpCache]:
    cache = HelpCache()
    prefetch((parse_page(p) for p in PAGES), cache)
    yield cache
    cache.close()


def test_the_pages_are_there() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "serving.md", "agent.md", "evaluation.md", "training.md"} <= names
    assert "synthesis.md" in names


def test_readme_leads_with_the_two_commands() -> None:
    """The README's first block is the demo and the test command, and CI runs the latter."""
    first = parse_page(REPO / "README.md").blocks[0]
    commands = [line.split("#")[0].strip() for line in first.text.splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "make test" in [line.strip() for line in ci]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_links_and_paths_resolve(path: Path) -> None:
    page = parse_page(path)
    commands = [words for _, words in shell_commands(page)]
    problems = [*link_problems(page), *path_problems(page, commands)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_commands_match_the_clis(path: Path, helps: HelpCache) -> None:
    problems = list(command_problems(parse_page(path), helps))
    assert not problems, "\n".join(problems)


# The checks themselves find what they are for, on pages written here.


def _page(tmp_path: Path, text: str, name: str = "page.md") -> Page:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return parse_page(path)


def _assert_link_problems(page: Page, *says: str) -> None:
    """The page's link problems are one for each of ``says``, in order, each saying it."""
    problems = list(link_problems(page))
    assert len(problems) == len(says), problems
    for problem, said in zip(problems, says, strict=True):
        assert said in problem, problems


def test_links_broken_and_whole(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Tiny checkpoints: `astra-serve tiny`\n")
    page = _page(
        tmp_path,
        "# Page é\n\n"
        "[ok](other.md) [ok](other.md#tiny-checkpoints-astra-serve-tiny) [ok](#page-é)\n"
        "[web](https://example.org/x) `[not a link](gone.md)`\n"
        "[gone](gone.md) [no anchor](other.md#nope) ![img](pic.png) [here](#absent)\n"
        "```bash\n[in a block](gone2.md)\n```\n",
    )
    _assert_link_problems(
        page,
        "gone.md does not exist",
        "other.md has no heading #nope",
        "pic.png does not exist",
        "page.md has no heading #absent",
    )


def test_reference_and_html_links(tmp_path: Path) -> None:
    (tmp_path / "there.png").write_bytes(b"")
    page = _page(
        tmp_path,
        "# T\n\nSee [the page][ref] and [other][ref2].\n\n[ref]: there.png\n[ref2]: <missing.md>\n"
        '<img src="there.png"> <a href="gone/page.md">x</a> <a href="https://example.org">y</a>\n',
    )
    _assert_link_problems(page, "missing.md does not exist", "gone/page.md does not exist")


def test_unclosed_fence_is_named(tmp_path: Path) -> None:
    message = "page.md:3: a fenced block is never closed"
    with pytest.raises(AssertionError, match=re.escape(message)):
        _page(tmp_path, "# T\n\n```bash\nastra-serve up\n")


def test_repeated_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = _page(tmp_path, "# A\n## Results\n## Results\n```\n# Results\n```\n")
    assert anchors(page) == {"a", "results", "results-1"}


def test_paths_written_as_code_must_exist(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "`training/sft/trl.py` `training/sft/gone.py` `runs/sft/final` "
        "`training/recipes/sft-astra-{14b,32b}.yaml`\n"
        "```bash\nastra-train sft --config training/recipes/missing.yaml\n```\n",
    )
    commands = [w for _, w in shell_commands(page)]
    problems = list(path_problems(page, commands))
    assert [p.split(": ", 1)[1] for p in problems] == [
        "training/sft/gone.py does not exist in the repository",
        "training/recipes/missing.yaml does not exist in the repository",
    ]


def test_shell_blocks_split_into_commands(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "```bash\n"
        "X=1 astra-serve up --model m &   # it's a comment\n"
        "astra-eval arenas validate a.jsonl && astra-eval arenas validate b.jsonl\n"
        "astra-train data sft in.jsonl --out d \\\n    [--min-reward 0.8]\n"
        "astra-agent run \"it's open --save r.jsonl\n"
        "```\n```python\nastra-serve up --nope\n```\n",
    )
    assert [w for _, w in shell_commands(page)] == [
        ["X=1", "astra-serve", "up", "--model", "m"],
        ["astra-eval", "arenas", "validate", "a.jsonl"],
        ["astra-eval", "arenas", "validate", "b.jsonl"],
        ["astra-train", "data", "sft", "in.jsonl", "--out", "d", "[--min-reward", "0.8]"],
        ["astra-agent", "run", "\"it's", "open", "--save", "r.jsonl"],
    ]


def test_commands_checked_against_help(tmp_path: Path, helps: HelpCache) -> None:
    page = _page(
        tmp_path,
        "Build one with `astra-serve tiny OUT [--sede N]`, save with `astra-agent run --save`,\n"
        "not with `pip install --foo` (not ours).\n"
        "```bash\n"
        "astra-serve up --model m --profile astra-14b --dry-run --no-dry-run -k K\n"
        ".venv/bin/astra-serve up --model m --modle m2 [--portt 8000]\n"
        "astra-serve upp --model m\n"
        "astra-eval bfcl parity --out runs/bfcl --concurrency 4\n"
        "astra-eval bfcl --out runs/bfcl --concurrency 4 --resume\n"
        "python -m training.replay --out runs/replay --seeed 1\n"
        "python -m somebody.else --anything\n"
        "huggingface-cli download x --local-dir y\n"
        "make demo && make no-such-target\n"
        "```\n",
    )
    problems = [p.split(": ", 2)[2] for p in command_problems(page, helps)]
    assert problems == [
        "`astra-serve up` has no option --modle",
        "`astra-serve up` has no option --portt",
        f"no subcommand 'upp' (it has {sorted(helps.get((str(BIN / 'astra-serve'),)).commands())})",
        "`astra-eval bfcl parity` has no option --concurrency",
        "`python -m training.replay` has no option --seeed",
        "the Makefile has no target 'no-such-target'",
        "`astra-serve tiny` has no option --sede",
    ]
