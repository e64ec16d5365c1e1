"""The random-stream policy: which key each attack's random start and each image draw from.

Every attack registered by name draws from a stream of its own (`attack_key`), and every image
from that stream folded with its index in the test split (`per_example`), so that batch size,
chunk size and device count change no draw, and two models evaluated with the same seed see the
same perturbations (common random numbers).
"""

from __future__ import annotations

import zlib

import jax

# The streams the committed figures were drawn with, numbered by hand before streams were derived
# from names: jax.random.split(PRNGKey(seed), 5)[k]. Every other attack's stream is its name's.
KEPT_STREAMS = {"pgd20": 1, "cw20": 2, "apgd_ce": 3, "apgd_dlr": 4}
# Derived streams lie at or above this: past every image index PR folds into the same root key
# (`attack_key`), past AutoAttack's own streams (100 + k), so a derived key is never one of theirs.
NAME_STREAMS_FROM = 2**24


def name_stream(name: str) -> int:
    """The key stream of an attack registered as `name`: a hash of the name (CRC-32, the same in
    every process and Python version, unlike `hash`) in [NAME_STREAMS_FROM, 2^31)."""
    return NAME_STREAMS_FROM + zlib.crc32(name.encode()) % (2**31 - NAME_STREAMS_FROM)


def attack_key(seed: int, name: str):
    """The random-start key of the attack registered as `name`, a stream of its own each (not
    independent of PR's noise: split(root, 5)[k] equals fold_in(root, k), PR's key of image k;
    that couples different images only, so no mean is biased): the kept streams are
    jax.random.split(PRNGKey(seed), 5)[KEPT_STREAMS[name]], every other name's
    fold_in(PRNGKey(seed), name_stream(name)) (PR keys its noise by PRNGKey(seed) itself)."""
    root = jax.random.PRNGKey(seed)
    if name in KEPT_STREAMS:
        return jax.random.split(root, len(KEPT_STREAMS) + 1)[KEPT_STREAMS[name]]
    return jax.random.fold_in(root, name_stream(name))


def per_example(attack, key, indices, x, y, *rest):
    """Runs `attack(key_i, x_i[None], y_i[None], *rest_i)` per example with key_i = fold_in(key,
    index_i); rest: further per-example arrays (or pytrees of them), each example's with a batch
    axis of 1."""

    def one(i, xi, yi, *ri):
        out = attack(jax.random.fold_in(key, i), xi[None], yi[None], *jax.tree.map(lambda a: a[None], ri))
        return jax.tree.map(lambda a: a[0], out)

    return jax.vmap(one)(indices, x, y, *rest)
