"""Test-wide settings: never reach a hub, and one intra-op thread (``SSR_TEST_THREADS`` sets
another count: .ci/run reruns the numeric tests with 2, so a kernel's threading is felt).

Tiny models gain nothing from intra-op threads and lose a lot to oversubscription.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # set before transformers / huggingface_hub are imported
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch

torch.set_num_threads(int(os.environ.get("SSR_TEST_THREADS", "1")))
