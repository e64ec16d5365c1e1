"""Appendix E's optimizer and schedule against PyTorch's SGD update written out by hand."""

import jax.numpy as jnp
import numpy as np

from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run.config import default_config


def optimizer_settings(cfg) -> optimizer_lib.OptimizerSettings:
    return config_lib.optimizer_settings(cfg)


def test_sgd_nesterov_coupled_weight_decay_matches_pytorch_formula():
    cfg = default_config()
    schedule = optimizer_settings(cfg).schedule(steps_per_epoch=10)
    tx = optimizer_lib.make_optimizer(optimizer_settings(cfg), schedule)
    p = jnp.array([1.0, -2.0, 0.5])
    grads = [jnp.array([0.1, 0.2, -0.3]), jnp.array([-0.5, 0.1, 0.0]), jnp.array([0.2, 0.2, 0.2])]
    opt_state = tx.init(p)
    # torch.optim.SGD(lr, momentum=m, nesterov=True, weight_decay=wd), dampening 0:
    #   g = grad + wd * p; buf = g (first step) else m * buf + g; p -= lr * (g + m * buf)
    ref, buf = np.array(p), None
    lr, m, wd = 0.01, 0.9, 5e-4
    for g in grads:
        updates, opt_state = tx.update(g, opt_state, p)
        p = p + updates
        gg = np.asarray(g) + wd * ref
        buf = gg if buf is None else m * buf + gg
        ref = ref - lr * (gg + m * buf)
    np.testing.assert_allclose(p, ref, rtol=1e-6)


def test_multistep_schedule_decays_at_epochs_75_and_90_of_100():
    cfg = default_config()
    spe = 195  # 50,000 // 256
    schedule = optimizer_settings(cfg).schedule(spe)
    for step, lr in [
        (0, 0.01),
        (75 * spe - 1, 0.01),
        (75 * spe, 0.001),
        (90 * spe - 1, 0.001),
        (90 * spe, 0.0001),
        (100 * spe - 1, 0.0001),
    ]:
        np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-5)


def test_the_atpr_recipe_trains_as_torch_sgd_with_its_milestones():
    """pgd_atpr_cifar10 against the AT-PR code's optimizer run in PyTorch itself:
    optim.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4) (no Nesterov) stepped by
    MultiStepLR([75, 90], 0.1) once an epoch, on the same gradients, across both milestones."""
    import torch

    from patjax.configs import pgd_atpr_cifar10

    cfg = pgd_atpr_cifar10.get_config()
    cfg.num_epochs = 100
    spe = 2  # steps per epoch: the milestones at epochs 75 and 90 fall at steps 150 and 180
    settings = optimizer_settings(cfg)
    tx = optimizer_lib.make_optimizer(settings, settings.schedule(spe))
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(4).astype(np.float32)
    grads = rng.standard_normal((100 * spe, 4)).astype(np.float32)
    p, opt_state = jnp.asarray(p0), tx.init(jnp.asarray(p0))
    w = torch.nn.Parameter(torch.tensor(p0))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=5e-4)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(sgd, milestones=[75, 90], gamma=0.1)
    for step, g in enumerate(grads):
        updates, opt_state = tx.update(jnp.asarray(g), opt_state, p)
        p = p + updates
        w.grad = torch.tensor(g)
        sgd.step()
        if (step + 1) % spe == 0:
            lr_scheduler.step()
        if step in (149, 150, 179, 180, len(grads) - 1):
            np.testing.assert_allclose(np.asarray(p), w.detach().numpy(), rtol=2e-5, atol=1e-6)
