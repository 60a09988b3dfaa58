"""What a forward costs here, learned from the forwards just measured: the step-time target's
model (the `max_step_ms` setting).

A mixed step computes one token for each decoding request and chunks of prompts. Its time is
close to linear in the two counts on one machine and model:

    seconds ~ c0 + c_decode x decode rows + c_prefill x prompt tokens

(c0: reading the weights and per-forward overhead; the two slopes: each row's and each prompt
token's share of the arithmetic and attention). The model is fitted by least squares over the
last WINDOW forwards the engine reports, so it follows the machine as it is now (a
busier CPU, a longer context). The scheduler asks it how many prompt tokens fit beside this
step's decode rows under the target; until enough varied forwards were seen it says "no
limit" rather than guess.
"""
from collections import deque

import torch

WINDOW = 64          # forwards remembered
MIN_SAMPLES = 8      # before any answer
MIN_CHUNK = 16       # prompt tokens a step may always take: a long prompt still progresses


class StepCost:
    def __init__(self):
        self.samples = deque(maxlen=WINDOW)   # (decode rows, prompt tokens, seconds)
        self._fit = None

    def observe(self, decode_rows, prefill_tokens, seconds):
        self.samples.append((decode_rows, prefill_tokens, seconds))
        self._fit = None

    def coefficients(self):
        """(c0, c_decode, c_prefill) by least squares over the window, or None while the forwards
        seen cannot separate them (too few, or no variety in one of the counts)."""
        if self._fit is None and len(self.samples) >= MIN_SAMPLES:
            self._fit = _least_squares([(1.0, d, p) for d, p, _ in self.samples], [s for _, _, s in self.samples])
        return self._fit

    def prefill_tokens(self, target_s, decode_rows):
        """Prompt tokens a forward with `decode_rows` decode rows can add and stay within
        `target_s` (at least MIN_CHUNK); None when the model cannot tell yet."""
        fit = self.coefficients()
        if fit is None or fit[2] <= 0:
            return None
        c0, cd, cp = fit
        return max(MIN_CHUNK, int((target_s - c0 - cd * decode_rows) / cp + 1e-6))   # 1e-6: float noise, not a token


def _least_squares(rows, ys):
    """Least-squares coefficients, or None when a count never varied (its slope cannot be told
    from the constant)."""
    if len({r[1] for r in rows}) < 2 or len({r[2] for r in rows}) < 2:
        return None
    x, y = torch.tensor(rows, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    return tuple(torch.linalg.lstsq(x, y[:, None]).solution[:, 0].tolist())
