"""How many tokens the next LLM step may take so that it ends within the latency targets.

A step's duration grows with its tokens (weights are read once per step, then work per token), so a
step of ``max_num_batched_tokens`` prompt tokens can last longer than a voice request's whole TTFT
target. ``StepCostModel`` fits ``seconds = base_s + per_token_s * tokens`` online from the steps the
device actually ran (exponentially weighted least squares, seeded by ``homeai bench calibrate`` or a
profile), and ``step_token_budget`` turns the targets of the interactive classes into a token budget:

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
CALIBRATION_FILE = "calibration.json"  # in the cache dir: what `homeai bench calibrate` measured here


@dataclass(slots=True)
class StepCostModel:
    """``seconds = base_s + per_token_s * tokens``, refitted after every observed step."""

    base_s: float = 0.02
    per_token_s: float = 0.0008
    _w: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def step_s(self, num_tokens: int) -> float:
        return self.base_s + self.per_token_s * num_tokens

    def tokens_within(self, seconds: float) -> int:
        """The most tokens a step may take to last at most ``seconds`` (0 when even an empty one won't)."""
        return max(0, int((seconds - self.base_s) / self.per_token_s + 1e-9))

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Fold in one measured step. Until the steps seen vary enough in size to fit a slope, only the
        base moves (the seed's slope is kept); the seed itself never weighs against measurements."""
        if seconds <= 0 or num_tokens <= 0:
            return
        self._w *= _DECAY
        self._sx *= _DECAY
        self._sy *= _DECAY
        self._sxx *= _DECAY
        self._sxy *= _DECAY
        self._add(float(num_tokens), seconds, 1.0)
        den = self._w * self._sxx - self._sx * self._sx
        if self._w >= 4.0 and den > 1e-6 * self._w * self._sxx:
            self.per_token_s = max(1e-7, (self._w * self._sxy - self._sx * self._sy) / den)
        self.base_s = max(0.0, (self._sy - self.per_token_s * self._sx) / self._w)

    def _add(self, x: float, y: float, w: float) -> None:
        self._w += w
        self._sx += w * x
        self._sy += w * y
        self._sxx += w * x * x
        self._sxy += w * x * y


def load_step_cost(path: Path) -> StepCostModel | None:
    """The seed of a device's step cost from a profile written by ``homeai bench calibrate`` (a decode
    step's per-sequence cost counts per token); None when there is none, or it cannot be read."""
    try:
        fit = json.loads(path.read_text())
        base_s, per_token_s = float(fit["base_s"]), float(fit["per_token_s"]) + float(fit.get("per_seq_s", 0.0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring the step cost calibration %s: %s", path, exc)
        return None
    if base_s < 0 or per_token_s <= 0:
        log.warning("ignoring the step cost calibration %s: base_s %s, per_token_s %s", path, base_s, per_token_s)
        return None
    return StepCostModel(base_s, per_token_s)


@dataclass(slots=True, frozen=True)
class ClassTargets:
    """What the planner knows of one interactive class this step."""

    ttft_s: float | None
    itl_s: float | None
    running: bool  # has running sequences (their next tokens are due)
    active: bool  # running, waiting, or seen lately


def step_token_budget(cost: StepCostModel, max_tokens: int, classes: list[ClassTargets]) -> int:
    """The token budget of the next step (see the module docstring); at least MIN_STEP_TOKENS."""
    limits_s: list[float] = []
    active = any(c.active for c in classes)
    for c in classes:
        if c.running and c.itl_s:
            limits_s.append(ITL_STEP_FRACTION * c.itl_s)
        if c.ttft_s:
            limits_s.append((TTFT_STEP_FRACTION if active else QUIET_TTFT_STEP_FRACTION) * c.ttft_s)
    if not limits_s:
        return max_tokens
    # Where the targets leave a step less token work than its fixed cost (a slow or busy CPU, on which no
    # step meets them anyway), cutting further only multiplies fixed costs: the device saturates and
    # every wait, voice's included, grows. A step keeps at least as much token work as its fixed cost.
    floor = max(MIN_STEP_TOKENS, cost.tokens_within(2 * cost.base_s))
    return min(max_tokens, max(floor, cost.tokens_within(min(limits_s))))
