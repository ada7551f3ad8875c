"""``astra-eval tau2``: τ²-bench (retail, telecom; airline too) against any OpenAI-compatible
endpoint, with the user simulator on a second one.

τ² itself — its tasks, databases, policies, tools, user-simulator loop and scorers — is
inspect_evals' (:data:`DATA_VERSION`), run unchanged by inspect_ai; what is ours is the
endpoint path and the player (:mod:`eval.tau2.adapter`, the one module that touches
inspect_ai), the run directory (one whole record per conversation appended as it ends,
``--resume``, ``--retry-errors``, the fingerprint that refuses another model, simulator or data
version), trials and pass^k, and the conversations as
:class:`~astra_agent.trajectory.Trajectory` records.

The run is :func:`eval.runner.run_eval`'s, with the user simulator as a second endpoint and
inspect_evals' loop as its player (:class:`eval.tau2.adapter.Tau2Player`).
"""

from __future__ import annotations

import atexit
import gzip
import logging
import math
import shutil
import sys
import tempfile
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from astra_agent.errors import ConfigError
from astra_agent.model import ModelConfig
from eval.results import ensure_writable_dir
from eval.runner import EvalSpec, ProgressHook, RunConfig, run_eval
from eval.tau2.records import Domain, Item, Tau2Domain, Tau2Record, Tau2Summary

if TYPE_CHECKING:
    from inspect_ai import Task

log = logging.getLogger(__name__)
NAME = "tau2"  # the eval kind (eval/kinds.py)

DOMAINS: tuple[Domain, ...] = ("retail", "telecom", "airline")
PAPER_DOMAINS: tuple[Domain, ...] = ("retail", "telecom")

# ASTRA's Table 1 (pass^1 × 100, 4 trials, temperature 0, user simulator GPT-5.1).
PUBLISHED: dict[str, dict[str, float]] = {
    "ASTRA-14B-Thinking-v1": {"retail": 68.00, "telecom": 47.37, "overall": 57.69},
    "ASTRA-32B-Thinking-v1": {"retail": 75.20, "telecom": 52.19, "overall": 63.70},
    "Qwen3-14B": {"retail": 55.00, "telecom": 37.10, "overall": 46.05},
}


def require_inspect_evals() -> None:
    """A clear error where inspect_evals (τ²'s tasks, tools and scorers) is not installed."""
    try:
        import inspect_evals.tau2  # noqa: F401
    except ImportError:
        raise ConfigError(
            "inspect-evals is not installed: `astra-eval tau2` runs its τ² tasks",
            hint="pip install 'astra-harness[tau2]' (inspect-evals==0.26.0)",
        ) from None


def contain_decompressed_data() -> None:
    """inspect_evals decompresses a τ² database (``db.json.gz``, 2.8 MB for retail) into a new
    temporary file each time an environment loads it, once per conversation, and never removes
    it: a full retail run left 1.3 GB in /tmp. Here each compressed file is decompressed once per
    process, into a directory of ours that is removed when the process exits. The files are only
    read (a database's changes stay in memory). Idempotent."""
    import inspect_evals.tau2.utils as upstream

    if getattr(upstream.uncompress_file, "astra_contained", False):
        return
    original = upstream.uncompress_file
    cache: dict[tuple[str, int, int], str] = {}
    holder: list[Path] = []

    def uncompress_once(input_path: str) -> str:
        if not str(input_path).endswith(".gz"):
            return original(input_path)
        source = Path(input_path)
        stat = source.stat()
        key = (str(source.resolve()), stat.st_mtime_ns, stat.st_size)
        if key not in cache:
            if not holder:
                holder.append(Path(tempfile.mkdtemp(prefix="astra-tau2-data-")))
                atexit.register(shutil.rmtree, holder[0], ignore_errors=True)
            target = holder[0] / f"{len(cache)}-{source.name[: -len('.gz')]}"
            partial = target.with_name(target.name + ".partial")
            with gzip.open(source, "rb") as f_in, open(partial, "wb") as f_out:
                shutil.copyfileobj(f_in, f_out)
            partial.replace(target)
            cache[key] = str(target)
        return cache[key]

    uncompress_once.astra_contained = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):  # those that imported it by name
        if name.startswith("inspect_evals.tau2") and getattr(module, "uncompress_file", None) is (
            original
        ):
            module.uncompress_file = uncompress_once  # type: ignore[attr-defined]


def data_version() -> dict[str, str]:
    """What τ²'s tasks and scoring are: the inspect-evals and inspect-ai versions and
    inspect_evals' τ² task version (runs are comparable only when all three agree)."""
    from inspect_evals.metadata import load_eval_metadata

    return {
        "inspect_evals": metadata.version("inspect-evals"),
        "inspect_ai": metadata.version("inspect-ai"),
        "tau2_task_version": str(load_eval_metadata("tau2").version),
    }


def _zero_temperature(value: Any) -> Any:
    """τ² is run at temperature 0 (the paper's setting) unless one is given."""
    if isinstance(value, dict) and "temperature" not in value:
        return {**value, "temperature": 0.0}
    return value


class Tau2Config(RunConfig):
    out: Path = Field(Path("runs/tau2"), description="results directory (checked writable)")
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    user: ModelConfig | None = Field(
        None, description="the user simulator's endpoint (default: the agent's)"
    )
    domains: list[Domain] = Field(default_factory=lambda: list(PAPER_DOMAINS), min_length=1)
    trials: int = Field(4, ge=1, le=64, description="conversations per task (pass^k up to k)")
    split: Literal["base", "train", "test"] = Field(
        "base",
        description="the split of τ²'s tasks: base (all of them, the paper's) or its train and "
        "test parts (train: conversations to learn from, e.g. as SFT data)",
    )
    tasks: list[str] | None = Field(None, description="only these task ids")
    limit: int | None = Field(None, ge=1, description="only the first N tasks of each domain")
    message_limit: int = Field(
        100, ge=1, description="user-simulator turns per conversation (τ²'s default)"
    )
    max_steps: int = Field(
        200,
        ge=1,
        description="model calls per conversation, the agent's and the simulator's together "
        "(τ²'s own bound is 200 messages); a conversation that reaches it ends, scored as it "
        "stands",
    )
    inspect_log: bool = Field(
        False,
        description="also keep inspect_ai's own log of every conversation under OUT/inspect "
        "(its transcript, store changes included: large, and 2.5x the CPU), for `inspect view`",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Temperature 0 for both endpoints unless given; the user simulator's endpoint is the
        agent's unless its own URL is given (a ``--user-model`` alone names another model
        served there)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        agent = _zero_temperature(data.get("model", {}))
        data["model"] = agent
        user = data.get("user")
        if isinstance(user, dict):
            inherited = {k: agent[k] for k in ("base_url", "api_key") if k in agent}
            data["user"] = _zero_temperature({**inherited, **user})
        return data

    @property
    def user_model(self) -> ModelConfig:
        return self.user or self.model


# ------------------------------------------------------------------ tasks


def load_task(domain: Domain) -> Task:
    """inspect_evals' τ² task of ``domain``, unshuffled (its compressed data decompressed
    once: :func:`contain_decompressed_data`)."""
    contain_decompressed_data()
    from inspect_evals.tau2 import tau2

    make = {"retail": tau2.tau2_retail, "telecom": tau2.tau2_telecom, "airline": tau2.tau2_airline}
    return make[domain](shuffle=False)


def split_ids(domain: Domain, split: str) -> list[str]:
    """The task ids of one of τ²'s splits of ``domain`` (its ``split_tasks.json``)."""
    import json

    from inspect_evals.tau2.utils import TAU2_DATA_DIR

    path = TAU2_DATA_DIR / "domains" / domain / "split_tasks.json"
    return [str(i) for i in json.loads(path.read_text(encoding="utf-8"))[split]]


def select_items(cfg: Tau2Config, tasks: dict[Domain, Task]) -> list[Item]:
    """Each selected task × trial, in the data's order; ``--tasks`` naming no task is an
    error that lists what exists."""
    wanted = set(cfg.tasks or [])
    items: list[Item] = []
    found: set[str] = set()
    for domain in cfg.domains:
        ids = [str(s.id) for s in tasks[domain].dataset]
        if cfg.split != "base":
            chosen = set(split_ids(domain, cfg.split))
            ids = [i for i in ids if i in chosen]
        if wanted:
            ids = [i for i in ids if i in wanted]
            found.update(ids)
        if cfg.limit:
            ids = ids[: cfg.limit]
        items += [Item(domain, i, t) for i in ids for t in range(1, cfg.trials + 1)]
    if wanted - found:
        missing = sorted(wanted - found)
        raise ConfigError(
            f"--tasks: {', '.join(map(repr, missing[:5]))} is not a task of "
            f"{', '.join(cfg.domains)} (split {cfg.split})",
            hint="task ids are as τ² names them: retail and airline '0', '1', …; telecom "
            "'[mobile_data_issue]…'",
        )
    return items


# ------------------------------------------------------------------ summary


def pass_hat_k(successes: int, trials: int, k: int) -> float:
    """τ-bench's pass^k of one task: the chance that k of its trials drawn without
    replacement all pass, C(c, k) / C(n, k)."""
    return math.comb(successes, k) / math.comb(trials, k) if trials >= k else float("nan")


def _domain(records: list[Tau2Record], trials: int) -> Tau2Domain:
    scored = [r for r in records if r.reward is not None]
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        by_task[r.task_id].append(r.reward or 0.0)
    complete = [int(sum(rs)) for rs in by_task.values() if len(rs) == trials]
    pass_k = {}
    if complete:
        for k in range(1, trials + 1):
            mean = sum(pass_hat_k(c, trials, k) for c in complete) / len(complete)
            pass_k[str(k)] = round(mean, 4)
    mean_reward = sum(r.reward or 0.0 for r in scored) / len(scored) if scored else None
    return Tau2Domain(
        tasks=len({r.task_id for r in records}),
        conversations=len(records),
        scored=len(scored),
        errors=len(records) - len(scored),
        mean_reward=None if mean_reward is None else round(mean_reward, 4),
        pass_hat_k=pass_k,
        tasks_with_all_trials=len(complete),
    )


def summarize(records: list[Tau2Record], trials: int) -> Tau2Summary:
    """Per domain: conversations, errors (not scored), the mean reward of the scored ones and
    pass^k over the tasks whose every trial was scored; overall pass^1: the mean of the
    domains' (as the paper's overall)."""
    by_domain: dict[str, list[Tau2Record]] = defaultdict(list)
    for r in records:
        by_domain[r.domain].append(r)
    domains = {d: _domain(rs, trials) for d, rs in sorted(by_domain.items())}
    ones = [d.pass_hat_k.get("1") for d in domains.values()]
    overall = round(sum(ones) / len(ones), 4) if ones and None not in ones else None  # type: ignore[arg-type]
    errors = sum(d.errors or 0 for d in domains.values())
    return Tau2Summary(
        conversations=len(records), errors=errors, trials=trials, overall_pass_1=overall,
        domains=domains,
    )  # fmt: skip


# ------------------------------------------------------------------ the run


async def evaluate_tau2(
    cfg: Tau2Config, progress: ProgressHook[Tau2Record] | None = None
) -> Tau2Summary:
    """Check ``--out`` and both endpoints, play every conversation not yet recorded (or, with
    ``--retry-errors``, recorded as an error), append each record as it ends, write
    summary.json."""
    require_inspect_evals()
    ensure_writable_dir(cfg.out)  # before τ²'s tasks load (seconds)
    from eval.tau2.adapter import USER, Tau2Player  # inspect_ai: imported as a run starts

    sources = {d: load_task(d) for d in cfg.domains}
    data = data_version()

    def summary_of(records: list[Tau2Record]) -> Tau2Summary:
        extra = {"data": data, "base_url": cfg.model.base_url}
        return summarize(records, cfg.trials).model_copy(update=extra)

    player = Tau2Player(
        sources=sources, log_dir=cfg.out / "inspect", keep_log=cfg.inspect_log,
        concurrency=cfg.concurrency, max_steps=cfg.max_steps,
    )  # fmt: skip
    spec = EvalSpec(
        items=select_items(cfg, sources),
        key=lambda i: i.id,
        player=player,
        endpoints={USER: cfg.user_model},
        record=Tau2Record,
        fingerprint={"data": data, "message_limit": cfg.message_limit, "max_steps": cfg.max_steps},
        summarize=summary_of,
        kind=NAME,
    )
    summary, _ = await run_eval(cfg, spec, progress)
    return summary
