#!/usr/bin/env python3
"""Writes a Zipf-like expert-load file (the format `--expert-load` reads, docs/eplb.md).

Expert e of layer l gets round(tokens / (1 + rank)^s)
tokens, where rank is a per-layer permutation of the experts.

    make_expert_load.py --experts 128 --layers 2 --s 1.0 --model qwen3-30b-a3b OUT.json
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--experts", type=int, required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--s", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--tokens", type=float, default=4096, help="tokens of the hottest expert")
    ap.add_argument("--model", default="")
    a = ap.parse_args()
    layers = []
    for layer in range(a.layers):
        # A fixed permutation per layer (7 is coprime with the expert counts used here).
        ranks = [(e * 7 + layer * 3) % a.experts for e in range(a.experts)]
        layers.append([round(a.tokens / (1 + r) ** a.s) for r in ranks])
    with open(a.out + ".tmp", "w") as f:
        json.dump({"model": a.model, "layers": layers}, f)
        f.write("\n")
    import os
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
