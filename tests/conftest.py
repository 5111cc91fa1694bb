"""Tiny models gain nothing from intra-op threads and lose a lot to oversubscription."""

import torch

torch.set_num_threads(1)
