"""Training pipeline: the Llama target LM and its distilled ReDrafter drafter.

    python -m redrafter_ext.train target  --minutes 55     # tokenizer + target -> checkpoints/target
    python -m redrafter_ext.train drafter --minutes 25     # distillation        -> checkpoints/drafter

Pure PyTorch / transformers: nothing here imports the native extension.
"""
