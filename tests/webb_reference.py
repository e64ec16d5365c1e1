"""A transcription of Webb, Rainforth, Teh and Kumar's `multilevel_uniform` (oval-group/statistical-robustness,
exp_6_3_mnist/run_exp.py at commit 5234e3833f027ecdc99609864da123358ce910e2; MIT License,
Copyright (c) 2018, University of Oxford, reproduced below), the reference patjax's AMLS
(`patjax.pat.amls`, the `rare_pr` evaluator) is checked against (tests/pat/test_amls.py) and timed
against (benchmarks/speed/amls_speed.py).

Line for line the authors' function on the CPU branch (`CUDA = False`), with these changes that
keep its numbers:
- the input bounds x_min, x_max are module globals there (MNIST's normalized 0 and 1); here they
  are arguments, 0 and 1 for patjax's [0, 1] images;
- `x_sample` and the particles are flat, (d,) and (N, d), as the MNIST experiment's are;
- the lines that only print or collect debugging statistics (`debug`, `stats`, commented-out
  code) are left out, and the unused constants (target_acc_ratio, max/min_width_proposal) with them;
- `count_max_levels` (500 there, a constant) is an argument with that default, and the random
  generator is torch's global one, seeded by the caller;
- the Uniform distributions are built with `validate_args=False`, PyTorch's default when the code
  was written (validation became the default in PyTorch 1.8): with validation, a point that float
  rounding puts on or past a bound of its proposal's support raises instead of weighing -inf.

MIT License

Copyright (c) 2018, University of Oxford

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""

import math

import torch
import torch.distributions as dist


def multilevel_uniform(
    prop,
    x_sample,
    sigma=1.0,
    rho=0.1,
    count_particles=1000,
    count_mh_steps=100,
    x_min=0.0,
    x_max=1.0,
    count_max_levels=500,
):
    prior = dist.Uniform(
        low=torch.max(x_sample - sigma, torch.tensor([x_min])),
        high=torch.min(x_sample + sigma, torch.tensor([x_max])),
        validate_args=False,
    )

    # Parameters
    width_proposal = sigma * torch.ones(count_particles) / 30
    width_inc = 1.02
    width_dec = 0.5

    # Sample the initial particles
    x = prior.sample(torch.Size([count_particles]))

    L_prev = -math.inf
    L = -math.inf
    lg_p = 0
    max_val = -math.inf
    levels = []

    # Loop over levels
    for level_idx in range(count_max_levels):
        acc_ratio = torch.zeros(count_particles)

        if L >= 0:
            break

        # Calculate current level
        s_x = prop(x).squeeze(-1)
        max_val = max(max_val, s_x.max().item())
        s_sorted, s_idx = torch.sort(s_x)
        L = min(s_sorted[math.floor((1 - rho) * count_particles)].item(), 0)
        if L == L_prev:
            L = 0
        levels.append(L)
        where_keep = s_x >= L
        where_kill = s_x < L
        count_kill = (where_kill).sum()
        count_keep = count_particles - count_kill

        # Terminate if change in level is below some threshold
        if count_keep == 0:
            return -math.inf, max_val, x, levels

        lg_p += torch.log(count_keep.float()).item() - math.log(count_particles)

        # Uniformly resample killed particles below the level
        new_idx = torch.randint(low=0, high=count_keep, size=(count_kill,), dtype=torch.long)
        x = x[where_keep]
        x = torch.cat((x, x[new_idx]), dim=0)
        width_proposal = width_proposal[where_keep]
        width_proposal = torch.cat((width_proposal, width_proposal[new_idx]), dim=0)

        acc_ratio = torch.zeros(count_particles)
        for mh_idx in range(count_mh_steps):
            # Propose new sample
            g_bottom = dist.Uniform(
                low=torch.max(x - width_proposal.unsqueeze(-1), prior.low),
                high=torch.min(x + width_proposal.unsqueeze(-1), prior.high),
                validate_args=False,
            )

            x_maybe = g_bottom.sample()
            s_x = prop(x_maybe).squeeze(-1)

            # Calculate log-acceptance ratio
            g_top = dist.Uniform(
                low=torch.max(x_maybe - width_proposal.unsqueeze(-1), prior.low),
                high=torch.min(x_maybe + width_proposal.unsqueeze(-1), prior.high),
                validate_args=False,
            )
            lg_alpha = (
                prior.log_prob(x_maybe) + g_top.log_prob(x) - prior.log_prob(x) - g_bottom.log_prob(x_maybe)
            ).sum(dim=1)
            acceptance = torch.min(lg_alpha, torch.zeros_like(lg_alpha))

            # Work out which ones to accept
            log_u = torch.log(torch.rand_like(acceptance))
            acc_idx = (log_u <= acceptance) & (s_x >= L)
            acc_ratio += acc_idx.float()
            x = torch.where(acc_idx.unsqueeze(-1), x_maybe, x)

        # Adapt the width proposal *for each chain individually*
        acc_ratio /= count_mh_steps

        width_proposal = torch.where(acc_ratio > 0.124, width_proposal * width_inc, width_proposal)
        width_proposal = torch.where(acc_ratio < 0.124, width_proposal * width_dec, width_proposal)

        L_prev = L

    # We return both the estimate of the log-probability of the integral and the set of adversarial examples
    s_x = prop(x).squeeze(-1)
    max_val = s_x.max().item()
    return lg_p, max_val, x, levels
