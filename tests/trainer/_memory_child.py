"""Child process of test_memory_bound: one training step on long sequences; prints peak RSS growth (MiB).

Run alone (a fresh process) so ru_maxrss measures this step and nothing else the test session did.
"""

import json
import resource
import sys

import torch

from fastrl.losses import LossConfig
from fastrl.trainer.batching import Sample
from fastrl.trainer.tiny import tiny_model
from fastrl.trainer.update import StepSettings, train_step


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(mode: str, tokens: int, vocab: int, n_seq: int) -> None:
    torch.set_num_threads(1)
    model = tiny_model(vocab, hidden_size=64, num_layers=1, num_heads=4, max_len=tokens + 8, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def samples(length):
        return [
            Sample([1] + torch.randint(3, vocab, (31,), generator=g).tolist(),
                   torch.randint(3, vocab, (length - 32,), generator=g).tolist(), 1.0 if i % 2 else -1.0)
            for i in range(n_seq)
        ]  # fmt: skip

    cfg = LossConfig()
    settings = StepSettings(cfg, tokens, True, 0, log_entropy=False)
    train_step(model, opt, samples(64), settings)  # warm-up
    big = samples(tokens)
    before = peak_mib()
    if mode == "fused":
        train_step(model, opt, big, settings)
    else:  # what an eager trainer does: full logits, log_softmax, gather
        for s in big:
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = model(ids).logits[:, len(s.prompt_ids) - 1 : -1].float()
            logp = logits.log_softmax(-1).gather(-1, torch.tensor([s.completion_ids]).unsqueeze(-1))
            (-(logp.mean()) * s.advantage).backward()
            del logits, logp
    print(json.dumps({"before_mib": before, "extra_mib": peak_mib() - before}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
