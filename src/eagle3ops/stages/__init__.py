"""The in-container EAGLE-3 pipeline stages: ``python -m eagle3ops stage NAME --run-dir /data/runs/<id>``.

A run directory (config: ``pipeline.yaml``, model :class:`eagle3ops.config.pipeline.PipelineConfig`)::

    pipeline.yaml
    prepare/  samples.jsonl (token ids + loss masks), manifest.json                      <- chat files
    extract/  hidden/data_NNNNNN.pt (3 aux layers + last, bf16), progress.jsonl, state.json, manifest.json
    vocab/    d2t.npy, t2d.npy, token_freq.json, manifest.json                           <- prepare
    train/    checkpoints/step_N/, final/ (speculators format, vLLM loads it), metrics.jsonl, manifest.json
                                                                                         <- extract + vocab

Each stage reads only the run directory (and the target model), checks its inputs' manifests first
(:func:`eagle3ops.stages.manifest.check_inputs`) and writes its own ``manifest.json`` last. extract and train
resume after an interruption. Modules: ``prepare``, ``extract``, ``vocab``, ``train`` (one per stage),
``chatdata`` (chat file reading), ``manifest`` (manifests and input checks), ``target`` (the target's text config
and text-backbone tensors, also under ``language_model.`` for wrappers such as Kimi-K2.5), ``probe`` (hidden-state
reference probe), ``cli`` (the typer sub-app).
"""
