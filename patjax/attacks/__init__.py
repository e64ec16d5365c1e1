"""Layer 3, the attacks: a classifier's logits read as margins, PGD (L-inf and L2), the baselines' inner
maximizations, APGD, FAB-T and Square; pure functions of arrays and keys. Imports `models`, `data` and `core`."""
