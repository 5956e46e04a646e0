"""``python -m redrafter_ext.train {target,drafter} ...``"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from . import chat_data, distill, kd, selfgen, target, teacher

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
    pt2 = sub.add_parser("teacher", help="teacher-forced shards (hidden states) of ShareGPT or self-distilled data "
                         "(resumable scratch cache)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    teacher.add_args(pt2)
    ps = sub.add_parser("selfgen", help="the target's own answers to ShareGPT and broad-pool prompts, as token ids "
                        "(resumable; committed)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    selfgen.add_args(ps)
    pk = sub.add_parser("kd", help="long, resumable distillation of a drafter from teacher shards",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    kd.add_args(pk)
    pe = sub.add_parser("evaluate", help="drafters' held-out agreement and tokens/step (the hand-written prompts' "
                        "answers, teacher shard folders)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    kd.add_eval_args(pe)
    a = p.parse_args(argv)
    if a.stage == "target":
        target.train(target.config_from_args(a))
    elif a.stage == "teacher":
        teacher.write_shards(teacher.config_from_args(a))
    elif a.stage == "evaluate":
        import json
        from pathlib import Path

        res = kd.evaluate_drafters(a.drafter, a.target, a.heldout or ["hand"], a.K, a.positions, a.shapes, a.cache)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    elif a.stage == "kd":
        kd.train_kd(kd.config_from_args(a))
    elif a.stage == "selfgen":
        selfgen.generate(selfgen.config_from_args(a))
    elif a.stage == "chat-data":
        chat_data.generate_chat_data(chat_data.config_from_args(a))
    else:
        distill.train(distill.config_from_args(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
