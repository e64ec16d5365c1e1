"""A transcription of Cohen, Rosenfeld & Kolter's `Smooth` (locuslab/smoothing, code/core.py at
commit 78a4d949e4f627d000a78908e001f8ca66c92943), the reference patjax's `certify` evaluator is
checked against (tests/evaluators/test_certify.py) and timed against (benchmarks/speed/certify_speed.py).

Line for line the authors' class, with three changes that keep its numbers:
- the noise is drawn on the input's device (`randn_like(batch)`), not on 'cuda';
- `scipy.stats.binom_test`, removed from SciPy 1.12, is `scipy.stats.binomtest(...).pvalue`, the
  same two-sided exact test;
- statsmodels' `proportion_confint(NA, N, alpha=2 * alpha, method="beta")[0]` is written out as
  the line statsmodels runs for it, `scipy.stats.beta.ppf(alpha, NA, N - NA + 1)` (0 at NA = 0);
  statsmodels is not a dependency of patjax.
"""

from math import ceil

import numpy as np
import torch
from scipy.stats import beta, binomtest, norm


class Smooth(object):
    """A smoothed classifier g"""

    # to abstain, Smooth returns this int
    ABSTAIN = -1

    def __init__(self, base_classifier: torch.nn.Module, num_classes: int, sigma: float):
        self.base_classifier = base_classifier
        self.num_classes = num_classes
        self.sigma = sigma

    def certify(self, x: torch.tensor, n0: int, n: int, alpha: float, batch_size: int) -> (int, float):
        self.base_classifier.eval()
        # draw samples of f(x+ epsilon)
        counts_selection = self._sample_noise(x, n0, batch_size)
        # use these samples to take a guess at the top class
        cAHat = counts_selection.argmax().item()
        # draw more samples of f(x + epsilon)
        counts_estimation = self._sample_noise(x, n, batch_size)
        # use these samples to estimate a lower bound on pA
        nA = counts_estimation[cAHat].item()
        pABar = self._lower_confidence_bound(nA, n, alpha)
        if pABar < 0.5:
            return Smooth.ABSTAIN, 0.0
        else:
            radius = self.sigma * norm.ppf(pABar)
            return cAHat, radius

    def predict(self, x: torch.tensor, n: int, alpha: float, batch_size: int) -> int:
        self.base_classifier.eval()
        counts = self._sample_noise(x, n, batch_size)
        top2 = counts.argsort()[::-1][:2]
        count1 = counts[top2[0]]
        count2 = counts[top2[1]]
        if binomtest(int(count1), int(count1 + count2), p=0.5).pvalue > alpha:
            return Smooth.ABSTAIN
        else:
            return top2[0]

    def _sample_noise(self, x: torch.tensor, num: int, batch_size) -> np.ndarray:
        with torch.no_grad():
            counts = np.zeros(self.num_classes, dtype=int)
            for _ in range(ceil(num / batch_size)):
                this_batch_size = min(batch_size, num)
                num -= this_batch_size

                batch = x.repeat((this_batch_size, 1, 1, 1))
                noise = torch.randn_like(batch) * self.sigma
                predictions = self.base_classifier(batch + noise).argmax(1)
                counts += self._count_arr(predictions.cpu().numpy(), self.num_classes)
            return counts

    def _count_arr(self, arr: np.ndarray, length: int) -> np.ndarray:
        counts = np.zeros(length, dtype=int)
        for idx in arr:
            counts[idx] += 1
        return counts

    def _lower_confidence_bound(self, NA: int, N: int, alpha: float) -> float:
        return beta.ppf(alpha, NA, N - NA + 1) if NA > 0 else 0.0


class Eval:
    """What `self.base_classifier.eval()` needs of a classifier that is never called."""

    def eval(self):
        return self


class GivenCounts(Smooth):
    """`Smooth` whose draws are the class counts it is handed, in the order it asks for them
    (CERTIFY: the n0 selection counts, then the n estimation counts; PREDICT: its n counts), so
    that its decisions can be compared with patjax's on the same counts."""

    def __init__(self, num_classes: int, sigma: float, draws):
        super().__init__(Eval(), num_classes, sigma)
        self.draws = list(draws)

    def _sample_noise(self, x, num: int, batch_size) -> np.ndarray:
        counts = np.asarray(self.draws.pop(0), dtype=int)
        assert counts.sum() == num, (counts.sum(), num)
        return counts


def smooth_on_counts(selection, estimation, alpha: float, sigma: float):
    """Per image (rows): the transcription's CERTIFY (class, radius) and PREDICT class on the
    given counts (PREDICT on the estimation counts)."""
    out = []
    for sel, est in zip(np.asarray(selection), np.asarray(estimation)):
        smooth = GivenCounts(len(sel), sigma, [sel, est, est])
        cls, radius = smooth.certify(None, int(sel.sum()), int(est.sum()), alpha, batch_size=1)
        out.append((int(cls), float(radius), int(smooth.predict(None, int(est.sum()), alpha, batch_size=1))))
    return out
