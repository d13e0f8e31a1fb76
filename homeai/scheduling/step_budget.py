"""How many tokens the next LLM step may take so that it ends within the latency targets.

A step's duration grows with its tokens (weights are read once per step, then work per token), so a
step of ``max_num_batched_tokens`` prompt tokens can last longer than a voice request's whole TTFT
target. ``StepCostModel`` fits a step's length from its rows, tokens and context online from the steps
the device actually ran (exponentially weighted least squares, seeded by ``homeai bench calibrate`` or a
profile; ``step_guard`` bounds lower-class work by it), and ``step_token_budget`` turns the targets of the
interactive classes into a token budget (a decode row's cost per token):

- while an interactive class has running sequences, a step lasts at most ``ITL_STEP_FRACTION`` of the
  tightest ITL target among them (the rest is room for an embedding batch between two steps);
- while interactive classes are active (running, waiting or seen lately), a step lasts at most
  ``TTFT_STEP_FRACTION`` of the tightest TTFT target, so a request arriving during a step still gets its
  own step within its target;
- never less token work than the step's fixed cost (``base_s``): where that outlasts the targets, a
  smaller step would not meet them either, and would only waste the device on fixed costs;
- when only background work runs, the budget is the configured maximum, cut only where one step would
  eat most of a TTFT target by itself (``QUIET_TTFT_STEP_FRACTION``; a slow CPU), so the first voice
  request after a quiet period is not stuck behind a step longer than its target.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ITL_STEP_FRACTION = 0.6
INTERACTIVE_HORIZON_S = 10.0  # interactive work seen this recently counts as active: steps and batches stay short
TTFT_STEP_FRACTION = 0.4
QUIET_TTFT_STEP_FRACTION = 0.75
MIN_STEP_TOKENS = 16
_DECAY = 0.97  # weight of older observations per new one (about the last 30 steps count)
# Once the fit has seen this many steps' worth, a step that took longer than OUTLIER_FACTOR times its
# prediction counts as that long: one step another process stalled (serve benches on the 2-core box: 0.5 %
# of steps past 3x, up to 13x) no longer shrinks the next ~30 steps' budgets, while a device that really
# got slower still lifts the fit by a few percent a step (twice as slow is learned in about a dozen).
OUTLIER_FACTOR = 3.0
_SETTLED_WEIGHT = 8.0
CALIBRATION_FILE = "calibration.json"  # in the cache dir: what `homeai bench calibrate` measured here


@dataclass(slots=True)
class StepCostModel:
    """A step's duration from its shape, refitted after every observed step:

    ``seconds = base_s + per_token_s * rows + prompt_token_s * (tokens - rows) + per_ctx_s * context``

    ``rows`` are the sequences in the step (a decode row is one token, its first), ``tokens`` all the
    tokens it computes (a prompt chunk of n tokens: one row, n - 1 further tokens) and ``context`` the
    tokens each row attends over (a chunk's start plus its tokens, summed). A caller that knows only the
    tokens (an embedding batch, ``step_s``/``tokens_within``) counts every token as a row, which is the
    older ``base_s + per_token_s * tokens``. ``prompt_token_s`` defaults to ``per_token_s`` and
    ``per_ctx_s`` to 0: without a calibration that separates them, a prompt token costs a decode row.

    The fit is an exponentially weighted least squares (about the last 30 steps count) held towards the
    seed by a light ridge penalty on each slope: a slope the steps seen do not vary enough to measure (all
    decodes: rows == tokens; a runtime that reports no context) keeps the seed's value and only the base
    moves, a slope they do measure is theirs after a few dozen steps."""

    base_s: float = 0.02
    per_token_s: float = 0.0008
    prompt_token_s: float | None = None
    per_ctx_s: float = 0.0
    _seed: tuple[float, float, float] | None = None
    _w: float = 0.0
    _sx: list[float] | None = None  # decayed sums of x (1, rows, extra tokens, context)
    _sxx: list[list[float]] | None = None
    _sxy: list[float] | None = None

    def __post_init__(self) -> None:
        if self.prompt_token_s is None:
            self.prompt_token_s = self.per_token_s

    def step_s(self, num_tokens: int) -> float:
        return self.base_s + self.per_token_s * num_tokens

    def predict_s(self, num_tokens: int, num_rows: int, num_ctx: int = 0) -> float:
        """A step of ``num_rows`` rows computing ``num_tokens`` tokens over ``num_ctx`` context tokens."""
        extra = max(0, num_tokens - num_rows)
        return (self.base_s + self.per_token_s * num_rows + self.prompt_token_s * extra  # type: ignore[operator]
                + self.per_ctx_s * num_ctx)

    def tokens_within(self, seconds: float) -> int:
        """The most tokens a step may take to last at most ``seconds`` (0 when even an empty one won't)."""
        return max(0, int((seconds - self.base_s) / self.per_token_s + 1e-9))

    def observe(self, num_tokens: int, seconds: float, num_rows: int | None = None, num_ctx: int = 0) -> None:
        """Fold in one measured step (``num_rows`` None: every token a row). Until the steps seen vary
        enough to fit a slope, only the base moves; the seed is held only as lightly as that needs."""
        if seconds <= 0 or num_tokens <= 0:
            return
        rows = num_tokens if num_rows is None else max(1, min(num_rows, num_tokens))
        if self._w >= _SETTLED_WEIGHT:
            seconds = min(seconds, OUTLIER_FACTOR * self.predict_s(num_tokens, rows, num_ctx))
        x = (1.0, float(rows), float(num_tokens - rows), float(max(0, num_ctx)))
        if self._sx is None or self._sxx is None or self._sxy is None:
            self._seed = (self.per_token_s, self.prompt_token_s, self.per_ctx_s)  # type: ignore[assignment]
            self._sx, self._sxy = [0.0] * 4, [0.0] * 4
            self._sxx = [[0.0] * 4 for _ in range(4)]
        self._w = self._w * _DECAY + 1.0
        for i in range(4):
            self._sx[i] = self._sx[i] * _DECAY + x[i]
            self._sxy[i] = self._sxy[i] * _DECAY + x[i] * seconds
            for j in range(4):
                self._sxx[i][j] = self._sxx[i][j] * _DECAY + x[i] * x[j]
        self._refit()

    def _refit(self) -> None:
        assert self._sx is not None and self._sxx is not None and self._sxy is not None and self._seed is not None
        # Ridge towards the seed on the slopes (the base is free): lambda_j = RIDGE * w * scale_j^2, so a
        # slope is the data's once its regressor varies by more than a few percent of its usual size.
        a = [row[:] for row in self._sxx]
        b = self._sxy[:]
        for j, (scale, seed) in enumerate(zip(_SCALES, self._seed, strict=True), start=1):
            lam = _RIDGE * self._w * scale * scale
            a[j][j] += lam
            b[j] += lam * seed
        beta = _solve(a, b)
        if beta is None:
            return
        # A noisy fit may not drive a token's cost to nothing: the step bounds would then admit any chunk.
        slopes = [max(_MIN_SLOPE * self._seed[0], beta[1]), max(_MIN_SLOPE * self._seed[1], beta[2]), max(0.0, beta[3])]
        self.per_token_s, self.prompt_token_s, self.per_ctx_s = slopes
        rest = self._sxy[0] - sum(s * self._sx[i] for i, s in enumerate(slopes, start=1))
        self.base_s = max(0.0, rest / self._w)


_RIDGE = 1e-4
_MIN_SLOPE = 0.01  # a fitted per-token slope stays above this fraction of its seed
_SCALES = (8.0, 256.0, 4096.0)  # a usual step's rows, extra prompt tokens and context tokens


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (a 4x4 system each step); None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


def load_step_cost(path: Path) -> StepCostModel | None:
    """The seed of a device's step cost from a profile written by ``homeai bench calibrate``: a row's first
    token costs a token and a sequence, a prompt's further tokens a token each, plus attention over the
    context; None when there is none, or it cannot be read."""
    try:
        fit = json.loads(path.read_text())
        base_s, per_token_s = float(fit["base_s"]), float(fit["per_token_s"])
        per_row_s = per_token_s + float(fit.get("per_seq_s", 0.0))
        per_ctx_s = float(fit.get("per_ctx_token_s", 0.0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring the step cost calibration %s: %s", path, exc)
        return None
    if base_s < 0 or per_row_s <= 0 or per_ctx_s < 0:
        log.warning("ignoring the step cost calibration %s: base_s %s, per_token_s %s", path, base_s, per_row_s)
        return None
    return StepCostModel(base_s, per_row_s, prompt_token_s=per_token_s if per_token_s > 0 else per_row_s,
                         per_ctx_s=per_ctx_s)


@dataclass(slots=True, frozen=True)
class ClassTargets:
    """What the planner knows of one interactive class this step."""

    ttft_s: float | None
    itl_s: float | None
    running: bool  # has running sequences (their next tokens are due)
    active: bool  # running, waiting, or seen lately


def step_time_limit(classes: list[ClassTargets]) -> float | None:
    """The longest the next step may last by the interactive classes' targets (None: no bound)."""
    limits_s: list[float] = []
    active = any(c.active for c in classes)
    for c in classes:
        if c.running and c.itl_s:
            limits_s.append(ITL_STEP_FRACTION * c.itl_s)
        if c.ttft_s:
            limits_s.append((TTFT_STEP_FRACTION if active else QUIET_TTFT_STEP_FRACTION) * c.ttft_s)
    return min(limits_s) if limits_s else None


def step_token_budget(cost: StepCostModel, max_tokens: int, classes: list[ClassTargets]) -> int:
    """The token budget of the next step (see the module docstring); at least MIN_STEP_TOKENS."""
    limit_s = step_time_limit(classes)
    if limit_s is None:
        return max_tokens
    # Where the targets leave a step less token work than its fixed cost (a slow or busy CPU, on which no
    # step meets them anyway), cutting further only multiplies fixed costs: the device saturates and
    # every wait, voice's included, grows. A step keeps at least as much token work as its fixed cost.
    floor = max(MIN_STEP_TOKENS, cost.tokens_within(2 * cost.base_s))
    return min(max_tokens, max(floor, cost.tokens_within(limit_s)))
