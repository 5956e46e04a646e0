"""``python -m redrafter_ext.train {target,drafter} ...``"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from . import chat_data, distill, target

    p = argparse.ArgumentParser(
        prog="python -m redrafter_ext.train",
        description="Train the small Llama target on the CPython stdlib, or distill a ReDrafter drafter from a target "
                    "(the small one, or a chat model such as smollm2-135m-instruct).",
    )
    sub = p.add_subparsers(dest="stage", required=True)
    pt = sub.add_parser("target", help="tokenizer + target LM (-> checkpoints/target)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    target.add_args(pt)
    pd = sub.add_parser("drafter", help="distill the drafter from a trained target (-> checkpoints/drafter)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    distill.add_args(pd)
    pc = sub.add_parser("chat-data", help="a chat target's own answers to the training prompts (resumable)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    chat_data.add_args(pc)
    a = p.parse_args(argv)
    if a.stage == "target":
        target.train(target.config_from_args(a))
    elif a.stage == "chat-data":
        chat_data.generate_chat_data(chat_data.config_from_args(a))
    else:
        distill.train(distill.config_from_args(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
