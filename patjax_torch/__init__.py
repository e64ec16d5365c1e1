"""PyTorch definitions of patjax's networks (`patjax_torch.models`), for the PyTorch tools that
evaluate or attack a model exported by `python -m patjax.export` (AutoAttack, RobustBench,
torchattacks). Needs torch; the `patjax` package itself never imports it."""
