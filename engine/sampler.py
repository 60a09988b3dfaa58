"""Turning logits into tokens: greedy, temperature, top-p, optionally seeded per request."""
import torch


def make_generator(seed, device):
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def sample_one(logits, temperature, top_p, generator):
    """One token id from a 1-D logits row."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top token
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits, params_list, generators):
    """One token per row; greedy rows go through a single argmax."""
    greedy = torch.argmax(logits, dim=-1).tolist()
    return [g if p.temperature <= 0 else sample_one(logits[i], p.temperature, p.top_p, generators[i])
            for i, (g, p) in enumerate(zip(greedy, params_list))]
