"""Hugging Face on two nodes: a small GPT-2 learns a text with DDP, then writes a line of it.

``sky.plugins.huggingface()`` installs ``transformers`` (and friends) on every node and, given
``token=os.environ["HF_TOKEN"]``, logs every worker in without the token ever showing in a repr,
a log or a command line: what ``from_pretrained`` needs for private and gated models. Here
nothing is downloaded: the model is built from a ``GPT2Config`` and the "tokenizer" maps
characters to ids, so the script runs offline. ``sky.plugins.torch()`` starts the process
group, so the loop is a plain DistributedDataParallel one.

Runs on this machine's CPU (two Local nodes, gloo)::

    pip install transformers "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
    python guides/hf_tiny_gpt.py
"""

import skyward as sky

TEXT = (
    "the pool starts the workers, the workers run the tasks, and when the block ends the pool "
    "stops every worker and releases every machine. "
) * 8


@sky.compute
@sky.stdout(only="head")
def train(text: str, steps: int = 150) -> dict:
    import torch
    import torch.distributed as dist
    import transformers
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    rank, world = dist.get_rank(), dist.get_world_size()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    end = len(chars)  # one id more, for the start/end token (never in the text)
    config = GPT2Config(vocab_size=end + 1, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=end, eos_token_id=end)
    torch.manual_seed(0)
    model = DDP(GPT2LMHeadModel(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(rank)  # each rank its own windows of the text
    first = None
    for step in range(steps):
        starts = torch.randint(0, len(ids) - 65, (16,), generator=g)
        batch = torch.stack([ids[s:s + 64] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of the two ranks
        optimizer.step()
        first = first if first is not None else loss.item()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}")

    model.eval()
    prompt = torch.tensor([[chars.index(c) for c in "the pool "]])
    with torch.no_grad():
        out = model.module.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=end)
    sample = "".join(chars[i] for i in out[0] if i != end)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    return {"rank": rank, "first": first, "last": loss.item(), "sample": sample, "checksum": checksum}


def main() -> None:
    plugins = [sky.plugins.torch(backend="gloo"), sky.plugins.huggingface()]  # token=os.environ["HF_TOKEN"]
    with sky.ComputePool(nodes=2, plugins=plugins) as pool:
        results = train(TEXT) @ pool
    head = results[0]
    print(f"loss {head['first']:.3f} -> {head['last']:.3f}; rank 0 writes: {head['sample']!r}")
    print(f"loss fell and the ranks agree: {head['last'] < head['first'] / 3 and len({r['checksum'] for r in results}) == 1}")


if __name__ == "__main__":
    main()
