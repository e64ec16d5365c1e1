#!/usr/bin/env python3
"""Memory, compile time and rate of the PR pass at several (batch, chunk) settings.

  python benchmarks/speed/pr_memory.py --model resnet18 500:5 100:25 500:25

One forward pass of the PR pass takes len(eval.pr.epsilons) x batch x chunk images
(`robustness.pr_statistics`), so the chunk (`eval.pr.chunk_size`) bounds its memory. For each
BATCH:CHUNK the pass (uniform noise, N = eval.pr.samples, a randomly initialized network, random
images) is compiled alone and reports its temporaries (the executable's memory analysis), compile
time (lowering included), images/s of one batch after a warm-up batch on one device (on a CPU
host, one core's device: not the evaluation's rate, which splits a batch over all of them) and,
on a GPU, the allocator's peak so far in the process (cumulative: list the settings from small
to large). One JSON line each.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("settings", nargs="+", metavar="BATCH:CHUNK")
    args = p.parse_args(argv)

    from patjax.core import devices

    devices.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    import jax
    import jax.numpy as jnp
    import numpy as np

    from patjax import api
    from patjax.evaluators import pr
    from patjax.models import networks
    from patjax.run import config as config_lib

    module = networks.create_model(args.model, "cifar10", 10)
    params, batch_stats = networks.init_variables(module, jax.random.PRNGKey(0))
    model_fns, _ = api.as_model((module, {"params": params, "batch_stats": batch_stats}))
    rng = np.random.default_rng(0)
    for spec in args.settings:
        batch, chunk = (int(v) for v in spec.split(":"))
        settings = config_lib.default_evaluation_settings(
            "cifar10", {"pr.distributions": ("uniform",), "pr.chunk_size": chunk}, evaluators="pr", batch_size=batch
        )
        fn = pr.make_batch_fn(model_fns, settings.evaluator_settings.view(pr.EVALUATOR), "pr_uniform")
        images = jnp.asarray(rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8))
        labels, indices = jnp.zeros((batch,), jnp.int32), jnp.arange(batch, dtype=jnp.int32)
        t0 = time.perf_counter()
        compiled = fn.lower(params, batch_stats, images, labels, indices).compile()
        compile_s = time.perf_counter() - t0
        jax.block_until_ready(compiled(params, batch_stats, images, labels, indices))
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(params, batch_stats, images, labels, indices))
        seconds = time.perf_counter() - t0
        stats = jax.devices()[0].memory_stats() or {}
        record = {
            "model": args.model,
            "batch": batch,
            "chunk": chunk,
            "images_per_forward": len(settings.evaluator_settings["pr"].epsilons) * batch * chunk,
            "temp_GiB": round(compiled.memory_analysis().temp_size_in_bytes / 2**30, 2),
            "compile_s": round(compile_s, 1),
            "img_s": round(batch / seconds, 1),
            "peak_GiB": round(stats["peak_bytes_in_use"] / 2**30, 2) if "peak_bytes_in_use" in stats else None,
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
        }
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
