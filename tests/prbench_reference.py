"""A transcription of PRBench's PR loop (wellzline/PRBenchmark, evaluate.py at commit
32eefbaa8182eeb39d9bb48e6f11466d1bff48b4: `run_prob` and the test branch of `func_pr`), the
reference patjax's `--pr_preset=prbench` is checked against (tests/evaluators/test_pr.py)
and timed against (benchmarks/speed/pr_speed.py).

Line for line their CIFAR branch under the law "Uniform", with three changes that keep its numbers:
- the images, labels and model are passed in rather than read from their loader into 'cuda'
  buffers of 10,000 images: `images` is (n, 3, 32, 32) in [0, 1], and `sample_num` is len(images);
- the Normal and Laplace priors beside the uniform one are not built (the uniform law is
  PRBench's protocol; building the others draws nothing);
- the per-image outcomes are returned beside their summary (`counts`: the non-adversarial samples
  of each kept image, -1 for a skipped one), and the log file and tqdm bar are left out.
"""

import statistics

import numpy as np
import torch
import torch.distributions as dist

# Their radius list: radius = [round(8/255, 2), 0.08, 0.1, 0.12].
RADII = (round(8 / 255, 2), 0.08, 0.1, 0.12)
COUNT_PARTICLES = 100  # their brute_force's count_particles: N = 100 samples per image

x_min = torch.tensor([0.0, 0.0, 0.0])
x_max = torch.tensor([1.0, 1.0, 1.0])


def run_prob(x, y, model, eps, sample_id, distribute, GE):
    def prop(x):
        model.eval()
        y = model(x)
        y_diff = torch.cat((y[:, :x_class], y[:, (x_class + 1) :]), dim=1) - y[:, x_class].unsqueeze(-1)
        y_diff, _ = y_diff.max(dim=1)
        return y_diff  # >0 means AE

    def brute_force(prop, distribute, count_iterations=1):
        count_above, count_total, count_particles = int(0), int(0), int(COUNT_PARTICLES)

        for i in range(count_iterations):
            prior = distribution[distribute]
            x = prior.sample(torch.Size([count_particles]))

            x = torch.clamp(x, x_sample - eps, x_sample + eps)
            x = torch.clamp(x, min=x_min.view(3, 1, 1), max=x_max.view(3, 1, 1))

            s_x = prop(x).squeeze(-1)
            count_above += int((s_x >= 0).float().sum().item())
            count_total += count_particles

        return count_above, count_total

    x_sample = x[sample_id]
    x_class = y[sample_id]

    prior_uni = dist.Uniform(  # CIFAR, SVHN, Tiny-ImageNet
        low=torch.max(x_sample - eps * (x_max - x_min).view(3, 1, 1), x_min.view(3, 1, 1)),
        high=torch.min(x_sample + eps * (x_max - x_min).view(3, 1, 1), x_max.view(3, 1, 1)),
    )

    distribution = {"Uniform": prior_uni}

    input = x_sample.view(1, 3, 32, 32)  # CIFAR, SVHN
    s_x = prop(input).squeeze(-1)

    if GE:
        with torch.no_grad():
            AEs, total = brute_force(prop, distribute, count_iterations=1)
        return AEs, total
    else:
        if s_x.item() < 0:
            with torch.no_grad():
                AEs, total = brute_force(prop, distribute, count_iterations=1)
            return AEs, total
        else:
            return -1, -1


def func_pr(images, labels, radius, model, distribute="Uniform", GE=False):
    """Their test branch of func_pr on `images`: per radius, the mean and standard deviation of
    PR_i over the images the model classifies correctly (s(x) < 0), and the per-image counts."""
    x, y = images, labels
    sample_num = len(images)
    result_pr, counts = {}, {}
    for eps in radius:
        pr, per_image = [], []
        for idx in range(sample_num):
            AEs, samples = run_prob(x, y, model, eps, idx, distribute, GE)
            if AEs >= 0:
                pr.append((samples - AEs) / samples)
            per_image.append(samples - AEs if AEs >= 0 else -1)
        mean_value, std_dev = statistics.mean(pr), statistics.stdev(pr)
        result_pr[f"PR_{str(eps)}"] = (mean_value, std_dev)
        counts[eps] = np.asarray(per_image)
    return result_pr, counts
