#!/usr/bin/env python3
"""PyTorch peer for the small CNN: benchmarks/speed/torch_pat_peer.py's PAT step on its `SmallCNN`.

The network is patjax's `networks.SmallCNN` (per-channel normalization, three conv3x3(no
bias)+BatchNorm+ReLU+max-pool(2) stages with 32/64/128 channels, a global average pool and a
linear head); the step, optimizer, timing and JSON line are torch_pat_peer.py's.

  python benchmarks/speed/torch_small_cnn_peer.py --batch 128 --langevin-steps 20 --iters 5
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_pat_peer  # noqa: E402

if __name__ == "__main__":
    torch_pat_peer.main(model="small_cnn")
