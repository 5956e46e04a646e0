"""``python -m redrafter_ext.train {target,drafter,chat-data,teacher,selfgen,kd,evaluate} ...``"""

from __future__ import annotations

import argparse
import sys


def _evaluate(a: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from . import kd

    res = kd.evaluate_drafters(a.drafter, a.target, a.heldout or ["hand"], a.K, a.positions, a.shapes, a.cache)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from . import chat_data, distill, kd, selfgen, target, teacher

    # stage: (help, adds its arguments, runs it on the parsed arguments)
    stages = {
        "target": ("tokenizer + target LM (-> checkpoints/target)",
                   target.add_args, lambda a: target.train(target.config_from_args(a))),
        "drafter": ("distill the drafter from a trained target (-> checkpoints/drafter)",
                    distill.add_args, lambda a: distill.train(distill.config_from_args(a))),
        "chat-data": ("a chat target's own answers to the training prompts (resumable)",
                      chat_data.add_args, lambda a: chat_data.generate_chat_data(chat_data.config_from_args(a))),
        "teacher": ("teacher-forced shards (hidden states) of ShareGPT or self-distilled data (resumable scratch cache)",
                    teacher.add_args, lambda a: teacher.write_shards(teacher.config_from_args(a))),
        "selfgen": ("the target's own answers to ShareGPT and broad-pool prompts, as token ids (resumable; committed)",
                    selfgen.add_args, lambda a: selfgen.generate(selfgen.config_from_args(a))),
        "kd": ("long, resumable distillation of a drafter from teacher shards",
               kd.add_args, lambda a: kd.train_kd(kd.config_from_args(a))),
        "evaluate": ("drafters' held-out agreement and tokens/step (the hand-written prompts' answers, teacher shard "
                     "folders)", kd.add_eval_args, _evaluate),
    }
    p = argparse.ArgumentParser(
        prog="python -m redrafter_ext.train",
        description="Train the small Llama target on the CPython stdlib, or distill a ReDrafter drafter from a target "
                    "(the small one, or a chat model such as smollm2-135m-instruct).",
    )
    sub = p.add_subparsers(dest="stage", required=True)
    for name, (help_, add_args, _) in stages.items():
        add_args(sub.add_parser(name, help=help_, formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    a = p.parse_args(argv)
    stages[a.stage][2](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
