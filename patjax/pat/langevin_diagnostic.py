"""Where does the Langevin chain settle? Algorithm 1 re-run step by step (the measurement;
`python -m patjax.diagnose` is its command line, which documents the figures).

For each step t, averaged over the images (and the K chains of each image): mean and max
|x_t - x| (per pixel), the L2 distance ||x_t - x||, the energy E_t of Algorithm 2 line 11
(per example), CE(x_t), the fraction misclassified, the drift (mean per-pixel gradient step,
what `langevin.tolerance` compares), the distance to the chain's last step mean |x_t - x_T|,
and the spread between the K chains of one image. `first_step_within` gives the first step
from which the chain stays within ENDPOINT_MARGIN times the spread between independent
endpoints.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from patjax.core.errors import UserError, check_counts, count
from patjax.data import cifar
from patjax.pat import langevin


def chain_curves(logits_fn, key, x, y, settings: langevin.LangevinSettings, chains: int, on_step=None) -> dict:
    """Per-step statistics of `chains` independent chains per image (arrays of length T+1,
    entry 0 the start), and "endpoint_spread", the mean |x_T - x'_T| between chains of one
    image. Pure jnp; jit it.

    Two passes over the same keys: the first finds each chain's endpoint x_T, the second
    measures every step's distance to it (a chain is deterministic given its key).
    on_step: a host function called after every step of either pass (2T calls), e.g. a progress
    bar's update; it changes no value.
    """
    T = settings.steps
    batch = x.shape[0]
    xs = jnp.repeat(x, chains, axis=0)  # chain k of image i is row i * chains + k
    ys = jnp.repeat(y, chains, axis=0)
    chain = langevin.langevin_chain(logits_fn, key, xs, ys, settings)
    axes = tuple(range(1, x.ndim))

    def run(measure):
        def body(x_t, t):
            new, drift = chain.step(t, x_t)
            if on_step is not None:
                jax.debug.callback(lambda _: on_step(), t)
            return new, measure(new, drift)

        first = measure(chain.start, jnp.full((xs.shape[0],), jnp.nan, xs.dtype))
        last, rest = jax.lax.scan(body, chain.start, jnp.arange(T))
        return last, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)

    end, _ = run(lambda x_t, drift: jnp.zeros(()))

    def measure(x_t, drift):
        delta = x_t - xs
        logits = logits_fn(x_t)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, ys)
        energy = langevin.per_example_energy(logits_fn, x_t, xs, ys, settings.c1, settings.c2)
        per_image = x_t.reshape((batch, chains) + x.shape[1:])
        return {
            "mean_abs_delta": jnp.mean(jnp.abs(delta)),
            "max_abs_delta": jnp.mean(jnp.max(jnp.abs(delta), axis=axes)),
            "l2_delta": jnp.mean(jnp.sqrt(jnp.sum(jnp.square(delta), axis=axes))),
            "energy": jnp.mean(energy),
            "cross_entropy": jnp.mean(ce),
            "misclassified": jnp.mean((jnp.argmax(logits, -1) != ys).astype(jnp.float32)),
            "drift": jnp.mean(drift),
            "distance_to_last": jnp.mean(jnp.abs(x_t - end)),
            "chain_spread": jnp.mean(jnp.std(per_image, axis=1)),
        }

    _, curves = run(measure)
    ends = end.reshape((batch, chains) + x.shape[1:])
    curves["endpoint_spread"] = jnp.mean(jnp.abs(ends[:, 1:] - ends[:, :1])) if chains > 1 else jnp.nan
    return curves


def compare_samplers(
    logits_fn, key, x, y, reference: langevin.LangevinSettings, candidate: langevin.LangevinSettings, sample=None
) -> dict:
    """How close a cheaper sampler's samples are to the reference sampler's, against the floor.

    Returns the candidate's mean and max gradient steps per example; the mean per-pixel
    |x_candidate - x_reference| (independent chains of the same image); and the floor, the
    same distance between two independent reference chains. A candidate at the floor draws
    from the reference's distribution as far as this distance can tell. Pure jnp; jit it, or
    pass `sample(key, settings) -> (x_adv, steps)`, each sampler compiled on its own.
    """
    if sample is None:
        sample = lambda k, settings: langevin.langevin_sample_with_steps(logits_fn, k, x, y, settings)  # noqa: E731
    ref_key, floor_key, cand_key = jax.random.split(key, 3)
    ref, _ = sample(ref_key, reference)
    ref2, _ = sample(floor_key, reference)
    cand, steps = sample(cand_key, candidate)
    return {
        "candidate_steps_mean": jnp.mean(steps.astype(jnp.float32)),
        "candidate_steps_max": jnp.max(steps),
        "reference_steps": jnp.float32(reference.steps),
        "distance_to_reference": jnp.mean(jnp.abs(cand - ref)),
        "floor": jnp.mean(jnp.abs(ref2 - ref)),
        "candidate_distance_to_x": jnp.mean(jnp.abs(cand - x)),
        "reference_distance_to_x": jnp.mean(jnp.abs(ref - x)),
    }


ENDPOINT_MARGIN = 1.1


def first_step_within(distance_to_last: np.ndarray, tolerance: float):
    """First t from which distance_to_last stays <= tolerance; None if only the last step does."""
    above = np.nonzero(~(np.asarray(distance_to_last) <= tolerance))[0]
    if len(above) == 0:
        return 0
    t = int(above[-1]) + 1
    return t if t < len(distance_to_last) - 1 else None


MAX_CHAINS_IN_ALL = 100_000  # images x chains run at once: 1.2 GB of CIFAR images in float32


@dataclasses.dataclass(frozen=True)
class DiagnosticSettings:
    """The diagnostic's own settings (`patjax.diagnose`'s flags, under their names), checked once.
    Every chain of every image runs at once, so their product is bounded too."""

    num_examples: int = count("--num_examples", 1, 10_000, default=128)  # at most the test split
    chains: int = count("--chains", 2, 1_000, default=4)  # two at least, for the spread
    steps: int = count("--steps", 1, 100_000, default=200)  # langevin.steps' bound
    init: str = "uniform"
    # The comparison's chains use seed + 1; PRNGKey keeps 32 bits.
    seed: int = count("--seed", 0, 2**32 - 2, default=0)
    tolerance: float | None = None  # a distance the chain is reported to stay within

    def __post_init__(self):
        check_counts(self)
        if self.num_examples * self.chains > MAX_CHAINS_IN_ALL:
            raise UserError(
                f"--num_examples x --chains must be at most {MAX_CHAINS_IN_ALL:,} (they run at once), "
                f"got {self.num_examples} x {self.chains}"
            )
        if self.tolerance is not None and not self.tolerance >= 0:
            raise UserError(f"--tolerance must be >= 0, got {self.tolerance}")
        langevin.LangevinSettings(init=self.init)  # the check of init, as for a config's


def diagnose(
    sampler: langevin.LangevinSettings,
    bn_mode: str,
    model_fns,
    state,
    split: cifar.Split,
    *,
    num_examples: int,
    chains: int,
    steps: int,
    init: str,
    seed: int,
    tolerance: float | None = None,
    on_step=None,
) -> dict:
    """The diagnostic's results dict (what sampler_diagnostic.json holds): the run's sampler
    (its c1, c2, eta, sigma, rho) with `steps`, `init` and no early stop, BatchNorm in `bn_mode`.
    on_step: called on the host after each of the 2 * steps chain steps (`chain_curves`)."""
    DiagnosticSettings(num_examples, chains, steps, init)
    settings = dataclasses.replace(sampler, steps=steps, init=init, tolerance=0.0)
    n = min(num_examples, len(split))
    x = cifar.to_float(jnp.asarray(split.images[:n]))
    y = jnp.asarray(split.labels[:n], jnp.int32)
    logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats, bn_mode)
    fn = jax.jit(lambda k, x, y: chain_curves(logits_fn, k, x, y, settings, chains, on_step))
    curves = {k: np.asarray(v, np.float64) for k, v in jax.device_get(fn(jax.random.PRNGKey(seed), x, y)).items()}
    spread = float(curves.pop("endpoint_spread"))
    result = {
        "settings": {
            **dataclasses.asdict(settings),
            "num_examples": n,
            "chains": chains,
            "seed": seed,
            "checkpoint_step": int(state.step),
            "bn_mode": bn_mode,
        },
        "curves": {k: [None if not np.isfinite(v) else float(v) for v in c] for k, c in curves.items()},
        "endpoint_spread": spread,
        "endpoint_margin": ENDPOINT_MARGIN,
        "steps_to_endpoint": first_step_within(curves["distance_to_last"], ENDPOINT_MARGIN * spread),
    }
    if tolerance is not None:
        result["tolerance"] = tolerance
        result["steps_to_tolerance"] = first_step_within(curves["distance_to_last"], tolerance)
    return result


def comparison(
    sampler: langevin.LangevinSettings,
    bn_mode: str,
    model_fns,
    state,
    split: cifar.Split,
    *,
    num_examples: int,
    steps: int,
    init: str,
    tolerance: float,
    candidate_steps: int,
    seed: int,
    on_sample=None,
) -> dict:
    """`compare_samplers` of the cheaper sampler (init, tolerance, at most candidate_steps) against
    the paper's (uniform start, `steps` steps), as sampler_diagnostic.json's "sampler_comparison".
    on_sample: called on the host after each of its three samplings (reference, floor, candidate)."""
    reference = dataclasses.replace(sampler, steps=steps, init="uniform", tolerance=0.0)
    candidate = dataclasses.replace(reference, init=init, tolerance=tolerance, steps=candidate_steps)
    n = min(num_examples, len(split))
    logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats, bn_mode)
    x = cifar.to_float(jnp.asarray(split.images[:n]))
    y = jnp.asarray(split.labels[:n], jnp.int32)
    run = jax.jit(lambda k, s: langevin.langevin_sample_with_steps(logits_fn, k, x, y, s), static_argnums=1)

    def sample(key, settings):  # one sampler at a time, so that progress can be shown between them
        out = jax.block_until_ready(run(key, settings))
        if on_sample is not None:
            on_sample()
        return out

    figures = jax.device_get(compare_samplers(logits_fn, jax.random.PRNGKey(seed), x, y, reference, candidate, sample))
    return {
        "reference": dataclasses.asdict(reference),
        "candidate": dataclasses.asdict(candidate),
        **{k: float(v) for k, v in figures.items()},
    }
