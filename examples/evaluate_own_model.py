"""Evaluate a classifier of your own with patjax: clean accuracy, PGD-20 and probabilistic
robustness with their intervals, on the first 64 CIFAR-10 test images: small enough for a CPU
(docs/api.md has the time).

  python examples/evaluate_own_model.py

The classifier here is a Flax module with its variables: patjax's small CNN with the weights of
a committed PGD-trained run (docs/results/table1_cpu), read as plain named arrays. A function
from [0, 1] images to logits works the same way: `api.evaluate(logits_fn, images, labels)`.
"""

import os

from flax import traverse_util
from safetensors.numpy import load_file

from patjax import api
from patjax.data import cifar
from patjax.models import networks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIGHTS = os.path.join(
    REPO, "docs", "results", "table1_cpu", "runs", "cifar10_small_cnn", "pgd_s0", "models", "step_000800.safetensors"
)


def main(num_images: int = 64):
    module = networks.create_model("small_cnn", "cifar10", num_classes=10)
    variables = traverse_util.unflatten_dict(load_file(WEIGHTS), sep="/")  # {"params": ..., "batch_stats": ...}
    split = cifar.load_split("cifar10", "test", cifar.find_data_dir())
    results = api.evaluate(
        (module, variables),
        split.images[:num_images],
        split.labels[:num_images],
        evaluators="clean,pgd20,pr",
        pr={"samples": 20},
    )
    acc, pgd = results["figures"]["clean_accuracy"], results["figures"]["pgd20"]
    pr = results["pr"]  # the headline PR: uniform noise, over the clean-correct images (Table 1's protocol)
    print(f"clean accuracy {acc['value']:.3f} {acc['interval']}")
    print(f"PGD-20 robust accuracy {pgd['value']:.3f} {pgd['interval']}")
    for level, figure in pr.items():
        print(f"PR at eps {level} {figure['value']:.3f} {figure['interval']} over {figure['n']} images")
    print("per-image arrays:", sorted(results["per_image"]))
    return results


if __name__ == "__main__":
    main()
