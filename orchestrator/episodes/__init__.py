"""One episode module per task kind, each with one entry point that training's rollout
collection and the evaluation scripts both call (through `orchestrator.loop.run_episode`):

    qa.run_qa_episode          search / code / answer tools with experts (PAPER.md §1)
    tau2.run_tau2_episode      the orchestrator as a tau2 agent talking to tau2's user simulator,
                               scored by tau2's evaluator (`LoopConfig.tau2_user: solo` -> tau2_solo)
    tau2_solo.run_solo_episode no user: the request is the first message, `done` ends it

`base` holds what they share: Task, LoopConfig, the per-task catalog, and `take_turn`, which
records each turn's token ids, loss mask and decoding constraint.
"""
