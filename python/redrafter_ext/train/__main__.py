"""``python -m redrafter_ext.train {target,drafter} ...``"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from . import distill, target

    p = argparse.ArgumentParser(
        prog="python -m redrafter_ext.train",
        description="Train the Llama target LM on the CPython stdlib, then distill the ReDrafter drafter from it.",
    )
    sub = p.add_subparsers(dest="stage", required=True)
    pt = sub.add_parser("target", help="tokenizer + target LM (-> checkpoints/target)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    target.add_args(pt)
    pd = sub.add_parser("drafter", help="distill the drafter from a trained target (-> checkpoints/drafter)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    distill.add_args(pd)
    a = p.parse_args(argv)
    if a.stage == "target":
        target.train(target.config_from_args(a))
    else:
        distill.train(distill.config_from_args(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
