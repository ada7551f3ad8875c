"""A directory claimed by a fingerprint: the one protocol of every run directory that a rerun
takes up only under the configuration that started it (``astra-eval`` results, synthesis
stages, training runs, verl jobs, the Table 2 experiment and its arenas).

A :class:`Claim` is the directory, the JSON file in it that records the claim, and this run's
fingerprint (the whole file, or its value under ``key``). It only reads until it writes:

* :meth:`Claim.check_place`: the directory can be created and written, before any work;
* :meth:`Claim.recorded`: what the file holds (None: no claim yet); a file that is not JSON,
  or lacks ``key``, is corrupt (:meth:`Claim.corrupt`);
* :meth:`Claim.differences`: how this fingerprint differs from a recorded one (``compare``:
  :func:`~astra_agent.runio.config_differences`, unless the place compares its own way);
* :meth:`Claim.refuse_other`: a ConfigError naming those differences, in the place's own
  words (:class:`Refusal`); :meth:`Claim.check` is the three outcomes in one call: no claim
  (False), this one (True), another one (refused);
* :meth:`Claim.write`: the claim recorded whole, laid out as the place has always written it
  (``dumps``: :func:`indented`, :func:`sorted_lines` or :func:`one_line`), so that run
  directories written before this module read and resume as they did.

What a place does with a claim of its own (resume it, leave a finished run as it is, set an
earlier run aside) stays the place's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_agent.config import check_writable
from astra_agent.errors import ConfigError
from astra_agent.runio import config_differences, probe_writable, write_text_atomic

Compare = Callable[[Any, Any], list[str]]  # (recorded fingerprint, this one) → differences


def indented(data: Any) -> str:
    """JSON indented by 2, non-ASCII as is, no final newline (``write_json_atomic``'s)."""
    return json.dumps(data, indent=2, ensure_ascii=False)


def sorted_lines(data: Any) -> str:
    """JSON indented by 2, keys sorted, ASCII, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def one_line(data: Any) -> str:
    """JSON on one line, no final newline."""
    return json.dumps(data)


@dataclass(frozen=True)
class Refusal:
    """A place's words for a claim it refuses. ``other`` (a directory claimed by another
    fingerprint) is formatted with ``dir`` and ``differences`` (joined by ``joiner``);
    ``corrupt`` (a claim that cannot be read) with ``path``, ``dir``, ``name`` (the file's)
    and ``why``. ``corrupt_hint``: the hint of a corrupt claim, where it is not ``hint``."""

    other: str
    hint: str
    joiner: str = "; "
    corrupt: str = "{path} is corrupt ({why})"
    corrupt_hint: str | None = None


@dataclass(frozen=True)
class Claim:
    """``dir`` claimed by ``fingerprint``, recorded in the JSON file ``dir/file`` (``file`` may
    name a subdirectory's file): the whole file, or its value under ``key``."""

    dir: Path
    file: str
    fingerprint: Any
    refusal: Refusal
    key: str | None = None
    compare: Compare = config_differences
    dumps: Callable[[Any], str] = indented

    @property
    def path(self) -> Path:
        return self.dir / self.file

    def check_place(self, what: str, hint: str) -> None:
        """A ConfigError now, before any work, where ``dir`` is a file (``hint`` says what to
        do), cannot be created or, where it exists, cannot be written in. ``what``: how the
        user named it (``--out``, ``output_dir``)."""
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"{what} {self.dir} is a file", hint=hint)
        if not self.dir.exists():
            check_writable(self.dir, what, kind="dir")
            return
        try:
            probe_writable(self.dir)
        except OSError as exc:
            raise ConfigError(
                f"{what} {self.dir} is not writable ({exc.strerror})",
                hint="pick a path in a writable directory",
            ) from None

    def corrupt(self, why: object) -> ConfigError:
        """The error of a claim file that cannot be read as one, for ``why``."""
        r = self.refusal
        message = r.corrupt.format(path=self.path, dir=self.dir, name=self.file, why=why)
        return ConfigError(message, hint=r.corrupt_hint or r.hint)

    def recorded(self) -> Any:
        """The JSON of the claim file; None where there is none."""
        if not self.path.is_file():
            return None
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise self.corrupt(exc) from None

    def differences(self, recorded: Any) -> list[str]:
        """How this fingerprint differs from the one in ``recorded`` (the claim file's JSON);
        empty: the same. A record that ``compare`` cannot take (a KeyError, TypeError or
        ValueError from it), or without ``key``, is corrupt."""
        if self.key is not None:
            if not isinstance(recorded, dict) or self.key not in recorded:
                raise self.corrupt(f"no {self.key!r}")
            recorded = recorded[self.key]
        try:
            return self.compare(recorded, self.fingerprint)
        except (KeyError, TypeError, ValueError) as exc:
            raise self.corrupt(exc) from None

    def refuse_other(self, recorded: Any) -> None:
        """A ConfigError naming the differences where ``recorded`` claims another
        fingerprint."""
        differences = self.differences(recorded)
        if differences:
            r = self.refusal
            message = r.other.format(dir=self.dir, differences=r.joiner.join(differences))
            raise ConfigError(message, hint=r.hint)

    def check(self) -> bool:
        """Whether ``dir`` is claimed by this fingerprint (False: by none); one claimed by
        another is refused (:meth:`refuse_other`)."""
        recorded = self.recorded()
        if recorded is None:
            return False
        self.refuse_other(recorded)
        return True

    def record(self) -> Any:
        """What the claim file holds where nothing else is recorded beside the fingerprint."""
        return self.fingerprint if self.key is None else {self.key: self.fingerprint}

    def text(self, record: Any = None) -> str:
        """The claim file's text: ``record`` (default: :meth:`record`) laid out by ``dumps``."""
        return self.dumps(self.record() if record is None else record)

    def write(self, record: Any = None) -> None:
        """Record the claim (:meth:`text`) whole, its directory created where missing."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, self.text(record))
